"""A prepared data folder: its manifest, the checks before training, and its documents.

``shardlab data prepare`` writes, in one folder:

* ``shard-NNNNN.bin``: the token ids of input file NNNNN, little-endian ``dtype``
  (uint16 or uint32), every document after the other; memory-mappable as it is
  (``np.memmap(path, dtype="<u2")``, as nanoGPT and Megatron read theirs);
* ``shard-NNNNN.idx``: the document boundaries, little-endian uint64 token offsets
  (documents + 1 of them: 0, the end of each document);
* ``tokenizer.json``: the tokenizer, byte for byte;
* ``manifest.json``: format and version, the tokenizer's SHA-256, vocabulary size and
  end-of-document token, the dtype, total tokens and documents, and per shard its
  source file, tokens, documents and the size and SHA-256 of both files; last
  ``manifest_sha256``, over the canonical JSON of the rest.

:func:`read_prepared` checks all of it before any rank starts (every field, every
file's size and SHA-256, the boundaries, every id below the vocabulary), each failure
one :class:`~shardlab.errors.SpecError` naming the field or the file. Nothing in the
folder is ever unpickled: the shards are raw numbers, the manifest JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from shardlab.data.documents import INDEX_DTYPE, PreparedDocuments
from shardlab.errors import SpecError

FORMAT, VERSION = "shardlab-data", 1
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
DTYPES: dict[str, str] = {"uint16": "<u2", "uint32": "<u4"}
MAX_MANIFEST_BYTES = 64 * 2**20
"""The largest manifest.json read (64 MiB: about 200,000 shards)."""
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def shard_names(i: int) -> tuple[str, str]:
    """The token and index file names of shard ``i``."""
    return f"shard-{i:05d}.bin", f"shard-{i:05d}.idx"


def digest(doc: dict[str, Any]) -> str:
    """SHA-256 of ``doc``'s canonical JSON (sorted keys, no spaces), without
    ``manifest_sha256``."""
    rest = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def write_manifest(folder: str | os.PathLike[str], doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its ``manifest_sha256``, written as ``folder/manifest.json``."""
    doc = {**doc, "manifest_sha256": digest(doc)}
    Path(folder, MANIFEST).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in blocks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class _Fields:
    """Reads fields of a manifest, each failure a SpecError naming ``manifest.FIELD``."""

    def __init__(self, where: str) -> None:
        self.where = where

    def error(self, name: str, value: Any, allowed: str) -> SpecError:
        return SpecError(f"manifest.{name}", value, f"{allowed} ({self.where})")

    def get(self, obj: Any, name: str, key: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise self.error(name, None, "is missing")
        return obj[key]

    def count(self, obj: Any, name: str, key: str) -> int:
        value = self.get(obj, name, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(name, value, "must be an integer >= 0")
        return value

    def text(self, obj: Any, name: str, key: str) -> str:
        value = self.get(obj, name, key)
        if not isinstance(value, str):
            raise self.error(name, value, "must be a string")
        return value

    def file(self, folder: Path, obj: Any, name: str, key: str) -> Path:
        value = self.text(obj, name, key)
        if not _PLAIN_NAME.match(value):
            raise self.error(name, value, "must be a plain file name in the folder")
        path = folder / value
        if not path.is_file():
            raise self.error(name, value, "names a file that is missing")
        return path


def _load_json(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise SpecError("data", str(folder), f"is a folder without {MANIFEST}; make one "
                        "with `shardlab data prepare`")
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise OSError(f"over {MAX_MANIFEST_BYTES:,} bytes")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SpecError("data", str(path), f"cannot be read ({e.strerror or e})") from None
    except ValueError as e:  # not JSON, or not UTF-8
        raise SpecError("data", str(path), f"is not JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise SpecError("data", str(path), "must hold a JSON object")
    return doc


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of ``folder`` with every field checked and every file's size and
    SHA-256 verified (the shards' contents: :func:`read_prepared`)."""
    root = Path(folder)
    doc = _load_json(root)
    f = _Fields(str(root / MANIFEST))
    if f.get(doc, "format", "format") != FORMAT:
        raise f.error("format", doc["format"], f"must be {FORMAT!r}")
    if f.get(doc, "version", "version") != VERSION:
        raise f.error("version", doc["version"], f"must be {VERSION} (this shardlab's)")
    if f.get(doc, "manifest_sha256", "manifest_sha256") != digest(doc):
        raise f.error("manifest_sha256", doc["manifest_sha256"], "does not match the "
                      "manifest's content (edited after it was written?)")
    dtype = f.text(doc, "dtype", "dtype")
    if dtype not in DTYPES:
        raise f.error("dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    tok = f.get(doc, "tokenizer", "tokenizer")
    vocab = f.count(tok, "tokenizer.vocab_size", "vocab_size")
    ids = int(np.iinfo(DTYPES[dtype]).max) + 1  # how many ids the dtype holds
    if not 0 < vocab <= ids:
        raise f.error("tokenizer.vocab_size", vocab, f"must be in [1, {ids:,}] for {dtype}")
    tok_file = f.file(root, tok, "tokenizer.file", "file")
    if sha256_file(tok_file) != f.text(tok, "tokenizer.sha256", "sha256"):
        raise f.error("tokenizer.sha256", tok["sha256"], f"does not match {tok_file.name}")
    shards = f.get(doc, "shards", "shards")
    if not isinstance(shards, list) or not shards:
        raise f.error("shards", shards if not isinstance(shards, list) else [],
                      "must be a non-empty list")
    item = np.dtype(DTYPES[dtype]).itemsize
    for i, shard in enumerate(shards):
        name = f"shards[{i}]"
        tokens = f.count(shard, f"{name}.tokens", "tokens")
        docs = f.count(shard, f"{name}.documents", "documents")
        for key, size in (("file", tokens * item), ("index", (docs + 1) * 8)):
            path = f.file(root, shard, f"{name}.{key}", key)
            if path.stat().st_size != size:
                raise f.error(f"{name}.{key}", path.name, f"is {path.stat().st_size:,} bytes; "
                              f"the manifest's counts make it {size:,} (truncated?)")
            want = f.text(shard, f"{name}.{key}_sha256", f"{key}_sha256")
            if sha256_file(path) != want:
                raise f.error(f"{name}.{key}_sha256", want, f"does not match {path.name}")
    for total in ("tokens", "documents"):
        if f.count(doc, total, total) != sum(s[total] for s in shards):
            raise f.error(total, doc[total], f"must be the sum of the shards' {total}")
    return doc


def read_prepared(folder: str | os.PathLike[str], doc_tokens: int
                  ) -> tuple[int, PreparedDocuments]:
    """``(vocab_size, documents)`` of a prepared folder, checked (:func:`read_manifest`),
    each document chopped into pieces of at most ``doc_tokens`` tokens (as ``--data
    FILE.bin`` chops); nothing is dropped. The documents stay in the memory-mapped shards
    (:class:`~shardlab.data.documents.PreparedDocuments`). SpecError when a shard's
    boundaries are not increasing from 0 to its length or an id is not below the
    vocabulary."""
    root = Path(folder)
    doc = read_manifest(root)
    vocab = doc["tokenizer"]["vocab_size"]
    where = str(root / MANIFEST)
    dtype = DTYPES[doc["dtype"]]
    for i, shard in enumerate(doc["shards"]):
        tokens = np.memmap(root / shard["file"], dtype=dtype, mode="r") \
            if shard["tokens"] else np.zeros(0, np.uint16)
        bounds = np.fromfile(root / shard["index"], dtype=INDEX_DTYPE)
        if bounds[0] != 0 or bounds[-1] != len(tokens) or np.any(np.diff(bounds) <= 0):
            raise SpecError(f"manifest.shards[{i}].index", shard["index"], "must hold "
                            f"increasing offsets from 0 to the shard's {len(tokens):,} "
                            f"tokens ({where})")
        if len(tokens) and int(tokens.max()) >= vocab:
            raise SpecError(f"manifest.shards[{i}].file", shard["file"], f"holds id "
                            f"{int(tokens.max()):,}, not below the vocabulary's {vocab:,} "
                            f"({where})")
    files = [(shard["file"], shard["index"]) for shard in doc["shards"]]
    return vocab, PreparedDocuments(root, files, dtype, doc_tokens)
