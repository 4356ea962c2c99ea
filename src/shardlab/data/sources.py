"""Input files as batches of documents: plain text cut into paragraphs, or JSONL.

* A ``.jsonl`` file (any case) holds one JSON object per line; its ``text`` field (or
  another, ``--text-field``) is one document. Blank lines are skipped; an empty text is
  skipped and counted; a line that is not an object with a string there is refused,
  naming the file and line.
* Any other file is UTF-8 text cut into paragraphs after each run of blank lines, the
  blank lines staying with the paragraph before them, as ``--data FILE.txt`` cuts bytes
  (:func:`shardlab.nn.data.byte_documents`): the documents concatenate back to the file.
  A paragraph longer than :data:`MAX_DOC_CHARS` (its blank lines aside) is cut into
  pieces, at line starts where it can be (:func:`_cut_long`), so a file without blank
  lines never becomes one huge document.

Files are read :data:`READ_BYTES` at a time, so memory stays bounded whatever their size;
the documents are the same whatever the read size (a cut is only made where the text
that follows it in the block already decides it).
"""

from __future__ import annotations

import codecs
import json
import operator
import re
from collections.abc import Iterator
from pathlib import Path

from shardlab.errors import SpecError

READ_BYTES = 256 * 2**10
"""Bytes read (and documents encoded) at a time: 256 KiB. A batch's chunk strings (one
per word) then stay in the CPU's caches and the allocator reuses their memory: 256 KiB
ran about twice as many tokens per CPU-second as 4 MiB here (32 to 256 KiB alike)."""
MAX_DOC_CHARS = 4 * 2**20
"""The longest paragraph kept whole, in characters (4 Mi)."""

# A paragraph ends after a newline followed by one or more blank (whitespace-only) lines
# (captured: re.split keeps the run, which stays with the paragraph before it).
_PARAGRAPH_END = re.compile(r"(\n(?:[ \t\r\f\v]*\n)+)")
_BLANK = " \t\r\f\v\n"
_VISIBLE = re.compile(r"[^ \t\r\f\v\n]")  # a character that ends a run of blank lines
_LINE_START = re.compile(r"\n(?=[^ \t\r\f\v\n])")  # a line end before a visible character


def is_jsonl(path: str) -> bool:
    """Whether ``path`` is read as JSONL (its name ends in ``.jsonl``)."""
    return Path(path).suffix.lower() == ".jsonl"


def documents(path: str, text_field: str = "text") -> Iterator[tuple[list[str], int, int]]:
    """``(documents, bytes read, empty documents skipped)`` batch by batch; the bytes
    summed are the file's size. SpecError naming the file (and line) on bad input."""
    if is_jsonl(path):
        yield from _jsonl(path, text_field)
    else:
        yield from ((docs, n, 0) for docs, n in _text(path))


def _paragraph_cuts(text: str, final: bool) -> tuple[list[str], str]:
    """Whole paragraphs of ``text`` and the rest to carry into the next block. A cut is
    whole when a visible character follows it in the block (a run of blank lines could
    go on in the next block otherwise); at the end of the file everything is whole."""
    parts = _PARAGRAPH_END.split(text)  # paragraph, blank-line run, paragraph, ..., rest
    rest = parts.pop()
    if not final and len(parts) >= 2 and _VISIBLE.search(rest) is None:
        rest = parts.pop(-2) + parts.pop() + rest  # the last run may go on: carry it
    docs = list(map(operator.add, parts[0::2], parts[1::2]))
    if final:
        docs.append(rest)
        rest = ""
    elif not docs and len(rest.rstrip(_BLANK)) > MAX_DOC_CHARS:  # a paragraph too long
        first = next(_cut_long(rest))
        docs, rest = [first], rest[len(first):]
    if docs and max(map(len, docs)) > MAX_DOC_CHARS:
        docs = [piece for doc in docs for piece in _cut_long(doc)]
    return [d for d in docs if d], rest


def _cut_long(doc: str) -> Iterator[str]:
    """``doc`` in pieces while its text without the blank lines at its end is longer than
    MAX_DOC_CHARS: each cut before a visible character at most MAX_DOC_CHARS in, at the
    start of a line where there is one. A cut depends only on the characters before it
    and the one after, so a paragraph still being read is cut where it will be whole."""
    while len(doc.rstrip(_BLANK)) > MAX_DOC_CHARS:
        head = doc[:MAX_DOC_CHARS + 1]
        lines = [m.end() for m in _LINE_START.finditer(head)]
        last_visible = len(head.rstrip(_BLANK)) - 1
        if lines:
            cut = lines[-1]
        elif last_visible > 0:
            cut = last_visible
        else:  # nothing but whitespace after the first character: the next visible one
            cut = next(m.start() for m in _VISIBLE.finditer(doc, 1))
        yield doc[:cut]
        doc = doc[cut:]
    yield doc


def _text(path: str) -> Iterator[tuple[list[str], int]]:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    carry, offset = "", 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(READ_BYTES)
            final = not raw
            try:
                text = carry + decoder.decode(raw, final)
            except UnicodeDecodeError as e:
                raise SpecError("input", path, f"is not UTF-8 text (bad byte near offset "
                                f"{offset + max(e.start, 0):,})") from None
            offset += len(raw)
            docs, carry = _paragraph_cuts(text, final)
            yield docs, len(raw)
            if final:
                return


def _jsonl(path: str, field: str) -> Iterator[tuple[list[str], int, int]]:
    docs: list[str] = []
    size = empty = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            size += len(line)
            if line.strip():
                try:
                    obj = json.loads(line)
                except ValueError:  # invalid JSON or not UTF-8 (UnicodeDecodeError)
                    obj = None
                text = obj.get(field) if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    raise SpecError("input", f"{path}:{number}", f"must be a JSON object "
                                    f"with a string `{field}` field (JSONL: one per line)")
                if text:
                    docs.append(text)
                else:
                    empty += 1
            if size >= READ_BYTES:
                yield docs, size, empty
                docs, size, empty = [], 0, 0
    yield docs, size, empty
