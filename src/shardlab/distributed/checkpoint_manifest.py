"""A checkpoint's manifest: finding checkpoints, checking them, and what must match to resume.

A checkpoint is a folder ``ROOT/step-N`` (N = optimizer steps done; written by
:class:`shardlab.distributed.checkpoint.Checkpointer`) whose ``manifest.json`` holds the
format, step, model shape, layout, world size, shardlab and torch versions, the data
position, the LR scheduler's state, AdamW's hyper-parameters, the loss history so far,
the size and XXH3-64 of every other file, and the SHA-256 of the manifest itself
(``manifest_sha256``, over the canonical JSON of the rest). Only folders renamed into
place with a manifest count (:func:`complete_steps`); a ``*.tmp`` folder a crash left
behind is ignored.

Before any rank starts, :func:`verify` checks the manifest's own checksum, every file's
size and XXH3-64, and that DCP's metadata is readable by the restricted reader
(:mod:`shardlab.distributed.checkpoint_reader`); :func:`check_compatible` refuses a
checkpoint whose model shape or data stream differs from the run that loads it.

**Why XXH3-64** (format 2; format 1 recorded SHA-256 and still verifies): the file
checksums are there to catch truncation, a torn or misdirected write and bit rot, not an
adversary: whoever can rewrite a shard can rewrite the manifest and its own checksum
too, so a cryptographic hash buys nothing. XXH3-64 (Yann Collet's xxHash, the ``xxhash``
package's ``xxh3_64``, seed 0) is non-cryptographic and misses a change with probability
about 2^-64 (it passes SMHasher's collision and distribution tests; xxHash's README), and
runs at 2.9 times zlib's CRC-32 and 7 times SHA-256 here (10.4 against 3.6 and 1.4 GB/s,
one core, a 264 MiB file in the page cache; medians of 7, load average 0.8). The writer
computes it on the bytes as it writes them (:mod:`shardlab.distributed.checkpoint_writer`),
and :func:`verify` checks the files on as many threads as there are files and cores:
``xxh3_64.update`` releases the GIL (a Python thread kept counting at full speed while
another hashed 264 MiB in one call; two files on two threads hashed 1.9 times as fast as
one).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import pickle
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from shardlab.config.model import ModelShape
from shardlab.data.documents import PreparedDocuments
from shardlab.distributed.checkpoint_reader import safe_reader
from shardlab.errors import SpecError

FORMAT = 2  # 2: files carry an XXH3-64; 1 (still read): a SHA-256
FORMATS = (1, 2)
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
    """Hex SHA-256 of a file, read in 1 MiB pieces (format 1 manifests)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()


def xxh3_file(path: Path) -> str:
    """XXH3-64 (seed 0) of a file as 16 hex digits (xxhash's canonical, big-endian form),
    over a read-only memory map (no copy out of the page cache) in 64 MiB pieces."""
    h = xxhash.xxh3_64()
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # mmap refuses an empty file
            return h.hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m, memoryview(m) as view:
            for start in range(0, len(view), 64 << 20):
                h.update(view[start:start + (64 << 20)])  # releases the GIL
    return h.hexdigest()


def _matches(path: Path, info: dict[str, Any]) -> bool:
    if "xxh3_64" in info:  # format 2
        return xxh3_file(path) == info["xxh3_64"]
    return sha256_file(path) == info["sha256"]


def _threads(jobs: int) -> int:
    return max(1, min(jobs, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def _digest(doc: dict[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _files(folder: Path, known: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    names = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != MANIFEST]
    if missing := sorted(set(known) - set(names)):  # written, then gone: never record that
        raise OSError(f"{folder}: {', '.join(missing)} written but not there")
    todo = [n for n in names if n not in known]
    with ThreadPoolExecutor(_threads(len(todo))) as pool:
        sums = dict(zip(todo, pool.map(lambda n: xxh3_file(folder / n), todo), strict=True))
    files = {}
    for n in names:
        size = (folder / n).stat().st_size
        if n in known and known[n]["bytes"] != size:  # the writer's count must be the file's
            raise OSError(f"{folder / n}: {size} bytes on disk, {known[n]['bytes']} written")
        files[n] = {"bytes": size,
                    "xxh3_64": known[n]["xxh3_64"] if n in known else sums[n]}
    return files


def write_manifest(folder: Path, doc: dict[str, Any],
                   digests: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Add every file's size and XXH3-64 and the manifest's own hash; write it atomically.

    ``digests``: ``{relative name: {"bytes": n, "xxh3_64": hex}}`` the writers computed as
    they wrote (:class:`~shardlab.distributed.checkpoint_writer.RawWriter`); the other
    files are read and checksummed here."""
    doc = {**doc, "files": _files(folder, digests or {})}
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
    if doc.get("format") not in FORMATS:
        raise SpecError("checkpoint", str(path), f"format {doc.get('format')!r}; this "
                        f"shardlab reads formats {', '.join(map(str, FORMATS))}")
    return doc


def verify(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest, after checking every file it lists: present, same size, same
    checksum (XXH3-64; SHA-256 in format 1), and DCP's metadata readable by
    :func:`safe_reader`. SpecError names the first bad file in the manifest's order."""
    folder = Path(folder)
    doc = read_manifest(folder)
    files = doc["files"]
    for name, info in files.items():  # sizes first: a truncated file costs no read
        # The file's name leads the reason too: an error line clips a long path (value).
        path = folder / name
        if not path.is_file():
            raise SpecError("checkpoint", str(path), f"{name} is missing")
        if path.stat().st_size != info["bytes"]:
            raise SpecError("checkpoint", str(path), f"{name} has {path.stat().st_size} "
                            f"bytes, the manifest says {info['bytes']} (truncated?)")
    with ThreadPoolExecutor(_threads(len(files))) as pool:
        # The largest files first, so the last thread to finish started early.
        order = sorted(files, key=lambda n: -files[n]["bytes"])
        good = dict(zip(order, pool.map(lambda n: _matches(folder / n, files[n]), order),
                        strict=True))
    for name, info in files.items():
        if not good[name]:
            kind = "XXH3-64" if "xxh3_64" in info else "SHA-256"
            raise SpecError("checkpoint", str(folder / name), f"{name}: {kind} does not "
                            "match the manifest (corrupt)")
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
