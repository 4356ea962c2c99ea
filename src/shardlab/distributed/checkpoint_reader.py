"""Reading a DCP checkpoint as data, never code.

DCP reads its tensors safely (``torch.load(f, weights_only=True)``), but unpickles its
``.metadata`` with plain ``pickle`` and any non-tensor value without that guard (torch
2.13, ``distributed/checkpoint/filesystem.py`` and ``default_planner.py``).
:func:`safe_reader` reads the metadata with an unpickler that resolves only DCP's own
metadata dataclasses and torch's ``Size``/dtype/layout names, and
:func:`safe_load_planner` refuses any non-tensor item. Every load of a shardlab
checkpoint goes through both (:mod:`shardlab.distributed.checkpoint`), and
:func:`shardlab.distributed.checkpoint_manifest.verify` reads the metadata with
:func:`safe_reader` before any rank starts.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta

from shardlab.errors import SpecError

_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                 "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta",
                 "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by name (torch.strided), a lookup
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds DCP's metadata and nothing else (no callable, no import)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


class _SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read by :class:`_MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _TensorsOnly(DefaultLoadPlanner):
    """DCP's default load planner that refuses every non-tensor (pickled) item."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        raise SpecError("checkpoint", read_item.dest_index.fqn,
                        "is a pickled object; shardlab loads tensors only")


def safe_reader(folder: str | os.PathLike[str]) -> Any:
    """A ``FileSystemReader`` for ``folder`` whose metadata unpickling is restricted."""
    return _SafeReader(str(folder))


def safe_load_planner() -> Any:
    """DCP's default load planner, refusing non-tensor (pickled) items."""
    return _TensorsOnly()
