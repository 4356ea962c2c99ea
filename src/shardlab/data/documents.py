"""The documents of a prepared folder, read from its memory-mapped shards on demand.

``shardlab train --data DIR`` hands every rank a :class:`PreparedDocuments`: a sequence of
token-id lists, one per piece (each document cut into pieces of at most ``doc_tokens``
tokens, as ``--data FILE.bin`` cuts), whose tokens stay in the shard files until a batch
asks for them (``np.memmap``, as nanoGPT and Megatron-LM read their ``.bin`` shards). What
crosses to a rank is the folder's name and the shard list, never the tokens: a rank
rebuilds the piece table (three integers per piece) from the ``.idx`` files, vectorised.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

INDEX_DTYPE = "<u8"
FINGERPRINT_BLOCK = 1 << 22
"""Tokens hashed per block by :meth:`PreparedDocuments.fingerprint` (32 MiB as int64)."""


def pieces(bounds: np.ndarray, doc_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of every piece of the documents ``bounds`` delimits (offsets 0, end of
    document 1, ...): document [a, b) gives pieces [a, a+t), [a+t, a+2t), ... cut at b.
    In document order, so the pieces of a shard cover its tokens once, in order."""
    a = bounds[:-1].astype(np.int64)
    b = bounds[1:].astype(np.int64)
    count = -(-(b - a) // doc_tokens)  # ceil: a document of n tokens gives ceil(n/t) pieces
    first = np.repeat(np.cumsum(count) - count, count)  # each piece's document's first piece
    starts = np.repeat(a, count) + doc_tokens * (np.arange(int(count.sum())) - first)
    return starts, np.minimum(starts + doc_tokens, np.repeat(b, count))


class PreparedDocuments(Sequence[list[int]]):
    """Pieces of the documents of ``shards`` ((token file, index file) pairs of a checked
    folder, in order), each at most ``doc_tokens`` long; ``dtype`` is the shards' numpy
    dtype (``"<u2"`` or ``"<u4"``)."""

    def __init__(self, folder: str | Path, shards: list[tuple[str, str]], dtype: str,
                 doc_tokens: int) -> None:
        self.folder, self.shards = str(folder), list(shards)
        self.dtype, self.doc_tokens = dtype, doc_tokens
        self._open()

    def _open(self) -> None:
        root = Path(self.folder)
        self._tokens: list[np.ndarray] = []
        shard_ids, starts, ends = [], [], []
        for i, (tokens, index) in enumerate(self.shards):
            path = root / tokens
            self._tokens.append(np.memmap(path, dtype=self.dtype, mode="r")
                                if path.stat().st_size else np.zeros(0, self.dtype))
            s, e = pieces(np.fromfile(root / index, dtype=INDEX_DTYPE), self.doc_tokens)
            shard_ids.append(np.full(len(s), i, dtype=np.int32))
            starts.append(s)
            ends.append(e)
        self._shard = np.concatenate(shard_ids)
        self._start = np.concatenate(starts)
        self._end = np.concatenate(ends)

    def __getstate__(self) -> dict[str, Any]:
        # The folder's name and shard list only: a rank maps the files itself.
        return {"folder": self.folder, "shards": self.shards, "dtype": self.dtype,
                "doc_tokens": self.doc_tokens}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return len(self._start)

    @overload
    def __getitem__(self, k: int) -> list[int]: ...

    @overload
    def __getitem__(self, k: slice) -> list[list[int]]: ...

    def __getitem__(self, k: int | slice) -> list[int] | list[list[int]]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if not -len(self) <= k < len(self):
            raise IndexError(k)
        k = k % len(self)
        tokens = self._tokens[int(self._shard[k])]
        return tokens[int(self._start[k]):int(self._end[k])].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        return (self[k] for k in range(len(self)))

    def lengths(self) -> np.ndarray:
        """Tokens in each piece (int64); every one is >= 1 (the index is checked)."""
        return self._end - self._start

    def fingerprint(self) -> str:
        """SHA-256 of the pieces' lengths then their token ids, little-endian int64: the
        figure :func:`shardlab.distributed.checkpoint_manifest.data_fingerprint` gives the
        same documents as lists, computed over the shards block by block (the pieces
        cover each shard's tokens once, in order)."""
        h = hashlib.sha256(self.lengths().astype("<i8").tobytes())
        for tokens in self._tokens:
            for s in range(0, len(tokens), FINGERPRINT_BLOCK):
                h.update(np.asarray(tokens[s:s + FINGERPRINT_BLOCK], dtype="<i8").tobytes())
        return h.hexdigest()
