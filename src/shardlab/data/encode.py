"""Documents to token ids, as ``tokenizers`` encodes them, several times faster.

``tokenizers`` spends most of its time cutting text into pieces with its regex (about
1 MB/s per core here). A byte-level BPE encodes each piece on its own, so a text cut
anywhere the pre-tokenizer would cut it anyway encodes as its parts do. For the
tokenizers :func:`shardlab.data.tokenizer.cache_refusal` accepts, every space followed by
a visible character (ASCII ``!`` to ``~``, or a Unicode letter or digit) is such a cut.
:class:`Encoder` therefore cuts a batch of documents at those spaces with ``str.split``
(or one stdlib regex when a document has a space before anything else), looks every
chunk up in a dict of byte strings, and encodes with ``tokenizers`` only the chunks it
has not seen. Natural text repeats its chunks (words
with the space before them), so after the first batches almost every chunk is a hit.

The documents of a batch are joined as ``MARK + doc0 + " " + MARK + doc1 ...``: the
space before each MARK is a cut, and a chunk that begins with MARK is a document's
first, whose cached bytes begin with :data:`SENTINEL` (an id no vocabulary has) and the
post-processor's prefix ids; the sentinels, found with numpy, are the document starts.
The first batch's first documents are checked against ``tokenizers``' own encoding; a
difference turns the cache off for the rest of the file.

Any other tokenizer runs as ``tokenizers`` runs it (``encode_batch_fast``).
"""

from __future__ import annotations

import operator
import re
from itertools import chain, compress, repeat

import numpy as np

from shardlab.data.tokenizer import TokenizerFile

SENTINEL = 0xFFFF_FFFF
"""Marks a document's start in the cached bytes (uint32; no tokenizer has 2^32 ids)."""
MARK = "\x01"
"""Begins each document of a joined batch (a batch with a document holding it is
encoded by ``tokenizers`` instead)."""
CACHE_ENTRIES = 1 << 20
"""Chunks cached before the cache starts over (about 100 MB of keys and values)."""
CHECKED_DOCS = 16
"""Documents of the first batch compared with ``tokenizers``' own encoding."""

# A space NOT followed by a visible character (or a document's mark): the batch needs the
# regex cut below instead of str.split.
_UNSAFE_SPACE = re.compile(r" (?![!-~\w\x01])")
# Before every space that is followed by a visible character or a document's mark.
_CUT = re.compile(r"(?= [!-~\w\x01])")
_U32 = np.dtype("<u4")


class Encoder:
    """Encodes batches of documents for one :class:`TokenizerFile` (one per process).

    ``cached`` says whether the chunk cache is in use (``note`` says why not, when it was
    turned off by the first batch's check).
    """

    def __init__(self, tf: TokenizerFile) -> None:
        self.tok = tf.build()
        self.cached = not tf.cached
        self.note = ""
        self._checked = False
        self._head = np.asarray([SENTINEL, *tf.prefix], _U32).tobytes()
        eos = [] if tf.eos_id is None else [tf.eos_id]
        self._tail_cached = np.asarray([*tf.suffix, *eos], _U32)  # HF adds the suffix itself
        self._tail_hf = np.asarray(eos, _U32)
        self._spaced: dict[str, bytes] = {}  # str.split pieces: " " + key (or a doc's first)
        self._chunks: dict[str, bytes] = {}  # regex pieces: the key itself

    def encode(self, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, lengths)``: every document's ids in order (uint32) and each
        document's number of tokens (int64), the prefix, suffix and eos included."""
        if not docs:
            return np.zeros(0, _U32), np.zeros(0, np.int64)
        if not self.cached:
            return self._encode_hf(docs)
        big = MARK + f" {MARK}".join(docs)
        if big.count(MARK) != len(docs):  # a document holds the mark itself
            return self._encode_hf(docs)
        tokens, lengths = self._encode_cached(big, len(docs))
        if not self._checked:
            self._checked = True
            k = min(CHECKED_DOCS, len(docs))
            want_tokens, want_lengths = self._encode_hf(docs[:k])
            if not (np.array_equal(lengths[:k], want_lengths)
                    and np.array_equal(tokens[:int(want_lengths.sum())], want_tokens)):
                self.cached = False
                self.note = "the chunk cache differed from tokenizers on the first documents"
                return self._encode_hf(docs)
        return tokens, lengths

    def _encode_hf(self, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.tok.encode_batch_fast(docs, add_special_tokens=True)
        ids = [e.ids for e in encodings]
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        tokens = np.fromiter(chain.from_iterable(ids), _U32, count=int(lengths.sum()))
        return _append(tokens, lengths, self._tail_hf)

    def _encode_cached(self, big: str, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
        if _UNSAFE_SPACE.search(big) is None:
            pieces, cache, spaced = big.split(" "), self._spaced, True
        else:
            pieces, cache, spaced = _CUT.split(big), self._chunks, False
        values = list(map(cache.get, pieces))
        try:
            data = b"".join(values)
        except TypeError:  # a None among them: chunks not seen yet
            new = _missing(pieces, values, values.count(None))
            if len(cache) + len(new) > CACHE_ENTRIES:  # start over with this batch's
                cache.clear()
                new = list(dict.fromkeys(pieces))
            self._fill(cache, new, spaced)
            data = b"".join(map(cache.__getitem__, pieces))
        stream = np.frombuffer(data, _U32)
        marks = np.flatnonzero(stream == SENTINEL)
        tokens = np.delete(stream, marks)
        starts = marks - np.arange(n_docs)
        lengths = np.diff(np.append(starts, len(tokens))).astype(np.int64)
        return _append(tokens, lengths, self._tail_cached)

    def _fill(self, cache: dict[str, bytes], new: list[str], spaced: bool) -> None:
        """Encode (with tokenizers) the distinct pieces ``new`` into ``cache``."""
        texts, heads = [], []
        for k in new:
            first = k.startswith(MARK) or (not spaced and k.startswith(" " + MARK))
            text = k[k.index(MARK) + 1:] if first else (" " + k if spaced else k)
            texts.append(text)
            heads.append(self._head if first else b"")
        encodings = self.tok.encode_batch_fast(texts, add_special_tokens=False)
        for k, head, e in zip(new, heads, encodings, strict=True):
            cache[k] = head + np.asarray(e.ids, _U32).tobytes()


def _missing(pieces: list[str], values: list[bytes | None], misses: int) -> list[str]:
    """The distinct pieces whose value is None, in order: found one by one with
    ``list.index`` when they are few, else picked out by ``compress`` (both at C speed;
    a Python loop over all of a batch's pieces would cost more than encoding them)."""
    if misses > 4096:
        return list(dict.fromkeys(compress(pieces, map(operator.is_, values, repeat(None)))))
    found: dict[str, None] = {}
    i = -1
    for _ in range(misses):
        i = values.index(None, i + 1)
        found[pieces[i]] = None
    return list(found)


def _append(tokens: np.ndarray, lengths: np.ndarray, tail: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """``tail`` (ids) inserted after every document."""
    if not tail.size:
        return tokens, lengths
    ends = np.cumsum(lengths)
    tokens = np.insert(tokens, np.repeat(ends, tail.size), np.tile(tail, len(lengths)))
    return tokens.astype(_U32, copy=False), lengths + tail.size
