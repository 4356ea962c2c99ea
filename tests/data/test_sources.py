"""Input files as documents (:mod:`shardlab.data.sources`): paragraphs that concatenate
back to the file whatever the read size, JSONL's text fields, bad input named by file and
line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab.data import sources
from shardlab.errors import SpecError

TEXT = st.lists(st.sampled_from(["a", "b c", "\n", "\n\n", "  \n", "\t", " ", "é", "\r\n"]),
                max_size=60).map("".join)


def read(path: Path) -> tuple[list[str], int]:
    docs, size = [], 0
    for batch, n, _ in sources.documents(str(path)):
        docs += batch
        size += n
    return docs, size


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sources")


@settings(max_examples=100, database=None)
@given(text=TEXT, read_bytes=st.integers(1, 7), max_chars=st.integers(3, 9))
def test_paragraphs_do_not_depend_on_the_read_size(folder: Path, text: str, read_bytes: int,
                                                   max_chars: int) -> None:
    path = folder / "text.txt"
    path.write_text(text, encoding="utf-8", newline="")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sources, "MAX_DOC_CHARS", max_chars)
        whole, size = read(path)
        mp.setattr(sources, "READ_BYTES", read_bytes)
        pieces, _ = read(path)
    assert pieces == whole and "".join(whole) == text and size == len(text.encode())
    assert all(d and len(d.rstrip(" \t\r\f\v\n")) <= max_chars for d in whole)
    # blank lines stay with the paragraph before them, as --data FILE.txt cuts bytes
    assert all(not d.startswith("\n\n") or i == 0 for i, d in enumerate(whole))


def test_jsonl_documents_and_bad_lines(tmp_path: Path) -> None:
    good = tmp_path / "a.JSONL"
    good.write_text(json.dumps({"text": "one"}) + "\n\n" + json.dumps({"text": ""}) + "\n"
                    + json.dumps({"body": "two", "text": "three"}) + "\n")
    batches = list(sources.documents(str(good)))
    assert [d for b, _, _ in batches for d in b] == ["one", "three"]
    assert sum(e for _, _, e in batches) == 1  # the empty text, skipped and counted
    other = tmp_path / "b.jsonl"
    other.write_text(json.dumps({"body": "two", "text": 3}) + "\n")
    assert [d for b, _, _ in sources.documents(str(other), "body") for d in b] == ["two"]
    for i, line in enumerate(['{"text": 3}', "[1]", "{nope", '{"txt": "a"}', b"\xff"]):
        bad = tmp_path / f"bad{i}.jsonl"
        bad.write_bytes(b'{"text": "ok"}\n' + (line if isinstance(line, bytes) else
                                               line.encode()) + b"\n")
        with pytest.raises(SpecError, match=rf"^input='.*bad{i}.jsonl:2': must be a JSON "
                           "object with a string `text`"):
            list(sources.documents(str(bad)))


def test_text_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café\n\nok".encode("latin-1"))
    with pytest.raises(SpecError, match=r"is not UTF-8 text .*offset 3"):
        list(sources.documents(str(bad)))
