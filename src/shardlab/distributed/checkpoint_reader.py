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

Items that :class:`shardlab.distributed.checkpoint_writer.RawWriter` stored as raw bytes
are read straight into the tensor being loaded (one ``readinto`` per item, by one thread
per file) when the region is one contiguous run of the stored chunk and the target is a
contiguous CPU tensor of the stored dtype, which is the case for every tensor of a
resume in the layout that wrote it; otherwise (another layout's shards, a GPU target)
the region or the whole chunk is read into a staging tensor and copied. Items of older
checkpoints (one ``torch.save`` archive each) go through DCP's own path, which loads
them with ``weights_only=True``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from shardlab.distributed.checkpoint_writer import RAW, THREADS, require_little_endian
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


def _span(sizes: tuple[int, ...], offsets: tuple[int, ...],
          lengths: tuple[int, ...]) -> tuple[int, int] | None:
    """(first element, elements) of the region ``offsets``/``lengths`` of a C-order chunk
    of ``sizes`` when it is one contiguous run, else None: every dim after the last partly
    read one is whole, every dim before it is read one index wide."""
    partial = [d for d in range(len(sizes)) if lengths[d] != sizes[d]]
    if partial and any(lengths[d] != 1 for d in range(partial[-1])):
        return None
    first, stride = 0, 1
    for d in reversed(range(len(sizes))):
        first += offsets[d] * stride
        stride *= sizes[d]
    return first, math.prod(lengths)


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's elements."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


class _SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read by :class:`_MetadataUnpickler` and raw items
    (:data:`~shardlab.distributed.checkpoint_writer.RAW`) read into their targets."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        # (name, chunk offsets) -> (chunk sizes, dtype): the stored shape of each item
        self.chunks = {(fqn, tuple(chunk.offsets)): (tuple(chunk.sizes), md.properties.dtype)
                       for fqn, md in metadata.state_dict_metadata.items()
                       if hasattr(md, "chunks") for chunk in md.chunks}

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        def raw(req: ReadItem) -> bool:
            return RAW in (self.storage_data[req.storage_index].transform_descriptors or ())

        older = [req for req in plan.items if not raw(req)]
        if older:  # torch.save archives (checkpoints written before RawWriter)
            super().read_data(dataclasses.replace(plan, items=older), planner).wait()
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            if raw(req):
                per_file.setdefault(self.storage_data[req.storage_index].relative_path,
                                    []).append(req)
        if per_file:
            require_little_endian()
        with ThreadPoolExecutor(max(1, min(THREADS, len(per_file)))) as pool:
            # list(): the first thread's exception is raised here
            list(pool.map(lambda nr: self._read_file(nr[0], nr[1], planner),
                          per_file.items()))
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_file(self, name: str, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        with open(self.fs.concat_path(self.path, name), "rb", buffering=0) as f:
            for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                self._read_item(f, name, req, planner)

    def _read_item(self, f: IO[bytes], name: str, req: ReadItem, planner: LoadPlanner) -> None:
        info = self.storage_data[req.storage_index]
        fqn = req.storage_index.fqn
        sizes, dtype = self.chunks[(fqn, tuple(req.storage_index.offset))]
        need = math.prod(sizes) * dtype.itemsize
        if info.length != need:
            raise SpecError("checkpoint", name, f"{fqn}: {info.length} bytes stored, its "
                            f"{list(sizes)} {dtype} chunk holds {need}")
        target = planner.resolve_tensor(req).detach()
        span = _span(sizes, tuple(req.storage_offsets), tuple(req.lengths))
        if span is None:  # a strided region: read the whole chunk, then take it
            whole = torch.empty(sizes, dtype=dtype)
            self._read_into(f, name, info.offset, whole)
            region = whole
            for d, (start, length) in enumerate(zip(req.storage_offsets, req.lengths,
                                                    strict=True)):
                region = region.narrow(d, start, length)
            target.copy_(region)
        else:
            first, count = span
            direct = (target.device.type == "cpu" and target.dtype == dtype
                      and target.is_contiguous() and target.numel() == count)
            into = target if direct else torch.empty(tuple(req.lengths), dtype=dtype)
            self._read_into(f, name, info.offset + first * dtype.itemsize, into)
            if not direct:
                target.copy_(into)
        planner.commit_tensor(req, target)

    @staticmethod
    def _read_into(f: IO[bytes], name: str, position: int, tensor: torch.Tensor) -> None:
        """Fill ``tensor`` with the bytes at ``position`` (a read may return fewer bytes
        than asked: Linux caps one at 2 GiB - 4 KiB)."""
        view, done = _bytes_of(tensor), 0
        f.seek(position)
        while done < view.nbytes:
            n = f.readinto(view[done:])
            if not n:
                raise SpecError("checkpoint", name, f"ends at byte {position + done}, "
                                f"{view.nbytes - done} bytes short (truncated)")
            done += n


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
