"""A prepared folder's documents read from its memory-mapped shards: the same pieces, in
the same order, as cutting the documents in memory, and the same fingerprint."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from shardlab.data.documents import PreparedDocuments, pieces


def write_shard(folder: Path, name: str, docs: list[list[int]], dtype: str) -> tuple[str, str]:
    np.asarray([t for d in docs for t in d], dtype=dtype).tofile(folder / f"{name}.bin")
    bounds = np.cumsum([0] + [len(d) for d in docs]).astype("<u8")
    bounds.tofile(folder / f"{name}.idx")
    return f"{name}.bin", f"{name}.idx"


def chop(docs: list[list[int]], t: int) -> list[list[int]]:
    return [d[s:s + t] for d in docs for s in range(0, len(d), t)]


def fingerprint(docs: list[list[int]]) -> str:
    """checkpoint_manifest.data_fingerprint's definition, restated here (it lives above
    this floor): lengths, then every token, as little-endian int64."""
    import hashlib
    h = hashlib.sha256(np.asarray([len(d) for d in docs], dtype="<i8").tobytes())
    for d in docs:
        h.update(np.asarray(d, dtype="<i8").tobytes())
    return h.hexdigest()


def test_pieces_cut_every_document() -> None:
    starts, ends = pieces(np.array([0, 5, 6, 13], dtype="<u8"), 3)
    assert starts.tolist() == [0, 3, 5, 6, 9, 12]
    assert ends.tolist() == [3, 5, 6, 9, 12, 13]


@pytest.mark.parametrize("dtype", ["<u2", "<u4"])
def test_same_pieces_as_in_memory(tmp_path: Path, dtype: str) -> None:
    rng = np.random.default_rng(0)
    shards = [[rng.integers(0, 300, int(n)).tolist() for n in rng.integers(1, 40, 9)]
              for _ in range(3)]
    files = [write_shard(tmp_path, f"s{i}", docs, dtype) for i, docs in enumerate(shards)]
    docs = PreparedDocuments(tmp_path, files, dtype, doc_tokens=7)
    want = chop([d for s in shards for d in s], 7)
    assert len(docs) == len(want) and list(docs) == want
    assert docs[-1] == want[-1] and docs[2:5] == want[2:5]
    assert docs.lengths().tolist() == [len(d) for d in want]
    assert docs.fingerprint() == fingerprint(want)
    again = pickle.loads(pickle.dumps(docs))  # what crosses to a rank
    assert len(pickle.dumps(docs)) < 1000 and list(again) == want
    with pytest.raises(IndexError):
        docs[len(want)]
