"""A checkpoint's manifest: finding checkpoints, checking them, and what must match to resume.

A checkpoint is a folder ``ROOT/step-N`` (N = optimizer steps done; written by
:class:`shardlab.distributed.checkpoint.Checkpointer`) whose ``manifest.json`` holds the
format, step, model shape, layout, world size, shardlab and torch versions, the data
position, the LR scheduler's state, AdamW's hyper-parameters, the loss history so far,
the size and SHA-256 of every other file, and the SHA-256 of the manifest itself
(``manifest_sha256``, over the canonical JSON of the rest). Only folders renamed into
place with a manifest count (:func:`complete_steps`); a ``*.tmp`` folder a crash left
behind is ignored.

Before any rank starts, :func:`verify` checks the manifest's own checksum, every file's
size and SHA-256, and that DCP's metadata is readable by the restricted reader
(:mod:`shardlab.distributed.checkpoint_reader`); :func:`check_compatible` refuses a
checkpoint whose model shape or data stream differs from the run that loads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from shardlab.config.model import ModelShape
from shardlab.data.documents import PreparedDocuments
from shardlab.distributed.checkpoint_reader import safe_reader
from shardlab.errors import SpecError

FORMAT = 1
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")
# What a manifest names that must match the run that loads it for the data stream to
# continue where it stopped (the position is a count of batches of this stream).
DATA_FIELDS = ("fingerprint", "seed", "global_batch", "seq")


# --- names and listing --------------------------------------------------------------------

def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """``root/step-N``: where the checkpoint after ``step`` optimizer steps lives."""
    return Path(root, f"step-{step}")


def complete_steps(root: str | os.PathLike[str]) -> dict[int, Path]:
    """Checkpoints renamed into place (``step-N`` with a manifest), by step; ``*.tmp`` and
    anything else in the folder are ignored."""
    folder = Path(root)
    if not folder.is_dir():
        return {}
    found = {}
    for p in folder.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / MANIFEST).is_file():
            found[int(m.group(1))] = p
    return found


def find(root: str | os.PathLike[str], step: int | None = None) -> Path:
    """The checkpoint to resume from: the latest complete one, or the one at ``step``."""
    folder = Path(root)
    if not folder.is_dir():
        raise SpecError("checkpoint_dir", str(folder), "does not exist (nothing to resume)")
    steps = complete_steps(folder)
    if not steps:
        raise SpecError("resume", "latest" if step is None else step,
                        f"no complete checkpoint in {folder} (partial *.tmp folders are "
                        "ignored)")
    if step is None:
        return steps[max(steps)]
    if step not in steps:
        raise SpecError("resume", step, f"no checkpoint at that step in {folder}; found "
                        f"{', '.join(str(s) for s in sorted(steps))}")
    return steps[step]


# --- manifest and checksums ---------------------------------------------------------------

def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()


def _digest(doc: dict[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _files(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size,
                                               "sha256": sha256_file(p)}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


def write_manifest(folder: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Add the files' sizes and hashes and the manifest's own hash; write it atomically."""
    doc = {**doc, "files": _files(folder)}
    doc["manifest_sha256"] = _digest(doc)
    tmp = folder / (MANIFEST + ".tmp")
    with tmp.open("w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(folder / MANIFEST)
    return doc


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a checkpoint folder, its own checksum checked (SpecError if not)."""
    path = Path(folder, MANIFEST)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise SpecError("checkpoint", str(folder), f"has no readable {MANIFEST} "
                        f"({e.strerror or e})") from e
    except ValueError as e:
        raise SpecError("checkpoint", str(path), f"is not valid JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("manifest_sha256") != _digest(doc):
        raise SpecError("checkpoint", str(path), "manifest checksum does not match its "
                        "contents (corrupt or edited)")
    if doc.get("format") != FORMAT:
        raise SpecError("checkpoint", str(path), f"format {doc.get('format')!r}; this "
                        f"shardlab reads format {FORMAT}")
    return doc


def verify(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest, after checking every file it lists: present, same size, same SHA-256,
    and DCP's metadata readable by :func:`safe_reader`. SpecError names the first bad file."""
    folder = Path(folder)
    doc = read_manifest(folder)
    for name, info in doc["files"].items():
        # The file's name leads the reason too: an error line clips a long path (value).
        path = folder / name
        if not path.is_file():
            raise SpecError("checkpoint", str(path), f"{name} is missing")
        if path.stat().st_size != info["bytes"]:
            raise SpecError("checkpoint", str(path), f"{name} has {path.stat().st_size} "
                            f"bytes, the manifest says {info['bytes']} (truncated?)")
        if sha256_file(path) != info["sha256"]:
            raise SpecError("checkpoint", str(path), f"{name}: SHA-256 does not match the "
                            "manifest (corrupt)")
    try:
        safe_reader(folder).read_metadata()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
        raise SpecError("checkpoint", str(folder / ".metadata"), f"unreadable: {e}") from e
    return doc


def shape_record(shape: ModelShape) -> dict[str, Any]:
    """The architecture fields of a shape (not its name or where it came from)."""
    record = asdict(shape)
    for key in ("name", "source"):
        record.pop(key)
    return record


def check_compatible(doc: dict[str, Any], shape: ModelShape, data: dict[str, Any],
                     where: str) -> None:
    """SpecError naming the first model-shape or data field that differs from ``doc``'s."""
    saved = doc["shape"]
    for key, now in shape_record(shape).items():
        if saved.get(key) != now:
            raise SpecError(key, now, f"differs from the checkpoint's {key}={saved.get(key)!r} "
                            f"({where}): a checkpoint loads only into the model shape "
                            "that wrote it")
    for key in DATA_FIELDS:
        if doc["data"].get(key) != data.get(key):
            name = "data" if key == "fingerprint" else key
            raise SpecError(name, data.get(key) if key != "fingerprint" else "(corpus)",
                            f"differs from the checkpoint's ({where}): the data position "
                            "counts batches of the stream it was saved with")


def data_fingerprint(docs: Sequence[list[int]]) -> str:
    """SHA-256 of the corpus (document lengths and token ids, little-endian int64); a
    prepared folder's memory-mapped documents compute the same figure block by block
    (:meth:`~shardlab.data.documents.PreparedDocuments.fingerprint`)."""
    if isinstance(docs, PreparedDocuments):
        return docs.fingerprint()
    h = hashlib.sha256()
    h.update(np.asarray([len(d) for d in docs], dtype="<i8").tobytes())
    for d in docs:
        h.update(np.asarray(d, dtype="<i8").tobytes())
    return h.hexdigest()
