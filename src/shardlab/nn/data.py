"""Corpora as token documents, and causal-LM batches with the masks a fair loss needs.

Three sources give documents (lists of token ids):

* the built-in garden language (:mod:`shardlab.nn.garden`), for tests and demos;
* :func:`byte_documents`: any local file, byte-level (ids 0, 1, 2 = pad, bos, eos; byte
  ``b`` is id ``b + 3``; vocab 259), split at blank lines and chopped, no tokenizer needed;
* :func:`bin_documents`: a pre-tokenized flat ``.bin`` of uint16/uint32 token ids, as
  nanoGPT's and Megatron's preparation scripts write them (read as raw numbers; nothing
  is ever unpickled).

:func:`make_batch` right-pads documents into a :class:`Batch` whose ``loss_mask`` marks
the real target tokens; :func:`batches` streams batches deterministically from a seed;
:meth:`Batch.split` is how data-parallel ranks (or micro-batches) take their share. Every
share's *summed* loss divided by :func:`global_token_normalizer` of the whole batch gives
exactly the one-device loss and gradient, however unevenly the real tokens fall.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch

from shardlab.data.documents import PreparedDocuments
from shardlab.errors import SpecError, require_nonnegative_int, require_positive_int

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_OFFSET = 3  # byte b has id b + BYTE_OFFSET, after pad/bos/eos
BYTE_VOCAB = 256 + BYTE_OFFSET
BIN_DTYPES: dict[str, str] = {"uint16": "<u2", "uint32": "<u4"}  # little-endian on disk
MAX_BIN_VOCAB = 1 << 20
"""The largest vocabulary a ``.bin`` may imply (1,048,576 ids). Real tokenizers stop near
262,144 (Gemma's); a larger id means a file read with the wrong ``--bin-dtype`` or not a
token file at all, and an embedding sized from it could need terabytes (a uint32 id near
4.3e9 at d=64 in fp32: 1.1 TB)."""

# A paragraph ends after a newline followed by one or more blank (whitespace-only) lines.
_PARAGRAPH_END = re.compile(rb"\n(?:[ \t\r\f\v]*\n)+")


# --- loaders ---------------------------------------------------------------------------

def _read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes; SpecError("data", path, ...) when missing, unreadable or empty."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpecError("data", str(path), f"must be a readable file ({e.strerror})") from e
    if not data:
        raise SpecError("data", str(path), "is empty")
    return data


def _chop(seq: list[int], size: int) -> list[list[int]]:
    """Consecutive pieces of ``seq`` of at most ``size`` items."""
    return [seq[i:i + size] for i in range(0, len(seq), size)]


def _paragraphs(data: bytes) -> list[bytes]:
    """``data`` cut after each blank-line run; the pieces concatenate back to ``data``."""
    cuts = [m.end() for m in _PARAGRAPH_END.finditer(data)]
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in pairwise(bounds) if b > a]


def byte_documents(path: str | os.PathLike[str],
                   doc_tokens: int = 256) -> tuple[int, list[list[int]]]:
    """A local file as byte-level documents: ``(vocab_size, docs)``, vocab_size = 259.

    The file is cut into paragraphs (after blank lines, which stay with the paragraph
    before them), long paragraphs are chopped into pieces of at most ``doc_tokens`` bytes,
    and each piece becomes ``[bos] + [b + 3 for b in piece] + [eos]`` (so at most
    ``doc_tokens + 2`` tokens). Nothing is dropped: the docs' bytes, in order, are the file.
    """
    require_positive_int("doc_tokens", doc_tokens)
    data = _read_bytes(path)
    docs = [[BOS_ID, *(b + BYTE_OFFSET for b in piece), EOS_ID]
            for para in _paragraphs(data) for piece in _chop(list(para), doc_tokens)]
    return BYTE_VOCAB, docs


def decode_bytes(doc: list[int]) -> bytes:
    """The bytes of a byte-level document (pad, bos and eos dropped)."""
    return bytes(t - BYTE_OFFSET for t in doc if t >= BYTE_OFFSET)


def bin_documents(path: str | os.PathLike[str], dtype: str = "uint16", doc_tokens: int = 256,
                  eos: int | None = None) -> list[list[int]]:
    """A flat pre-tokenized file of ``dtype`` token ids (little-endian) as documents.

    With ``eos``, the stream is cut after every ``eos`` (the separator stays at the end of
    its document, as nanoGPT appends it, so the model learns to predict it) and documents
    longer than ``doc_tokens`` are chopped; without it, the stream is cut into chunks of
    ``doc_tokens`` tokens. Nothing is dropped or added: the docs concatenate to the file.
    """
    if dtype not in BIN_DTYPES:
        raise SpecError("dtype", dtype, f"must be one of {', '.join(BIN_DTYPES)}")
    require_positive_int("doc_tokens", doc_tokens)
    if eos is not None:
        require_nonnegative_int("eos", eos)
    item = np.dtype(BIN_DTYPES[dtype])
    data = _read_bytes(path)  # checks existence and emptiness; raw bytes, never pickle
    if len(data) % item.itemsize:
        raise SpecError("data", str(path), f"size {len(data)} bytes is not a multiple of "
                        f"{item.itemsize} ({dtype})")
    tokens = np.frombuffer(data, dtype=item)
    if eos is None:
        pieces = [tokens]
    else:
        pieces = [p for p in np.split(tokens, np.flatnonzero(tokens == eos) + 1) if p.size]
    return [chunk for p in pieces for chunk in _chop(p.tolist(), doc_tokens)]


def bin_vocab(docs: list[list[int]], path: str | os.PathLike[str], dtype: str) -> int:
    """The vocabulary a ``.bin``'s documents imply: its largest token id + 1; SpecError
    naming that id when the vocabulary would exceed :data:`MAX_BIN_VOCAB`."""
    largest = max(max(d) for d in docs if d)
    if largest >= MAX_BIN_VOCAB:
        raise SpecError("data", str(path), f"its largest token id is {largest:,} ({dtype}), "
                        f"a vocabulary of {largest + 1:,}: more than the {MAX_BIN_VOCAB:,} "
                        "allowed (real tokenizers have at most about 262,144 ids); is "
                        "--bin-dtype right?")
    return largest + 1


# --- batches ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Batch:
    """A right-padded causal-LM batch; every tensor is [b, s] int64 (b sequences, s tokens).

    ``targets[:, t]`` is the token after ``input_ids[:, t]``. ``loss_mask`` is 1 where the
    target is a real token (0 where it is padding); ``pad_mask`` is 1 where the input is a
    real token (the model's attention ignores padded keys).
    """

    input_ids: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    pad_mask: torch.Tensor

    def __post_init__(self) -> None:
        shape = self.input_ids.shape
        if len(shape) != 2 or any(t.shape != shape for t in
                                  (self.targets, self.loss_mask, self.pad_mask)):
            raise SpecError("batch", tuple(shape), "all four tensors must be [b, s] alike")

    @property
    def size(self) -> int:
        """Number of sequences (b)."""
        return int(self.input_ids.shape[0])

    @property
    def seq(self) -> int:
        """Sequence length in tokens (s)."""
        return int(self.input_ids.shape[1])

    @property
    def real_tokens(self) -> int:
        """Number of real target tokens (the sum of ``loss_mask``)."""
        return int(self.loss_mask.sum())

    def split(self, n: int) -> list[Batch]:
        """``n`` equal consecutive shares along the batch dimension (data-parallel ranks or
        micro-batches); ``n`` must divide ``size``."""
        require_positive_int("n", n)
        if self.size % n:
            raise SpecError("n", n, f"must divide the batch size ({self.size})")
        per = self.size // n
        parts = [t.split(per) for t in
                 (self.input_ids, self.targets, self.loss_mask, self.pad_mask)]
        return [Batch(*share) for share in zip(*parts, strict=True)]

    def chunk(self, i: int, n: int) -> Batch:
        """Share ``i`` of :meth:`split` ``(n)`` (what rank ``i`` of ``n`` trains on)."""
        shares = self.split(n)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise SpecError("i", i, f"must be an integer in [0, {n})")
        return shares[i]


def _check_docs(docs: Sequence[list[int]]) -> None:
    if not docs:
        raise SpecError("docs", 0, "need at least one document")
    if isinstance(docs, PreparedDocuments):  # pieces of a checked index: none is empty
        return
    for k, doc in enumerate(docs):
        # An empty row would leave its padded queries nothing to attend to (NaN logits).
        if len(doc) == 0:
            raise SpecError("docs", k, "every document needs at least one token")


def make_batch(docs: list[list[int]], seq: int, pad: int = 0) -> Batch:
    """Right-pad ``docs`` into a :class:`Batch` of ``len(docs)`` sequences of ``seq`` tokens.

    Each document is cut to its first ``seq + 1`` tokens; input = doc[:-1], target =
    doc[1:]. The masks come from the documents' lengths, not from comparing ids with
    ``pad``, so a real token whose id equals ``pad`` (e.g. id 0 in a GPT-2 tokenized
    ``.bin``) still counts.
    """
    require_positive_int("seq", seq)
    _check_docs(docs)
    full = torch.full((len(docs), seq + 1), pad, dtype=torch.int64)
    lengths = torch.tensor([min(len(d), seq + 1) for d in docs], dtype=torch.int64)
    for row, (doc, n) in enumerate(zip(docs, lengths.tolist(), strict=True)):
        full[row, :n] = torch.tensor(doc[:n], dtype=torch.int64)
    pos = torch.arange(seq)[None, :]
    return Batch(input_ids=full[:, :-1].contiguous(), targets=full[:, 1:].contiguous(),
                 loss_mask=(pos < lengths[:, None] - 1).to(torch.int64),
                 pad_mask=(pos < lengths[:, None]).to(torch.int64))


def batches(docs: Sequence[list[int]], batch_size: int, seq: int, seed: int = 0,
            pad: int = 0) -> Iterator[Batch]:
    """An endless, deterministic stream of batches of ``batch_size`` documents.

    Epoch ``e`` visits the documents in the order of ``random.Random(seed + e)``'s shuffle
    and yields consecutive groups of ``batch_size``; a last group smaller than that is left
    out, so every batch has the same size and splits evenly across ranks.
    """
    require_positive_int("batch_size", batch_size)
    require_positive_int("seq", seq)
    _check_docs(docs)
    if batch_size > len(docs):
        raise SpecError("batch_size", batch_size,
                        f"must be <= the number of documents ({len(docs)})")
    epoch = 0
    while True:
        order = list(range(len(docs)))
        random.Random(seed + epoch).shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield make_batch([docs[k] for k in order[start:start + batch_size]], seq, pad)
        epoch += 1


def global_token_normalizer(batch: Batch) -> int:
    """The number of real target tokens in the whole (global) batch.

    Every data-parallel rank and every micro-batch sums its per-token losses
    (:func:`shardlab.nn.loss.lm_loss_sum`) and divides by this one number, so the summed
    gradients equal one device's gradient of the mean loss over all real tokens. Dividing
    each share by its own token count and then averaging the shares (the mean of means)
    gives each share equal weight instead of each token: when documents differ in length
    a token in a short share counts for more, and the result depends on how the batch was
    split. Raises SpecError when the batch has no real target token (0 would divide by 0).
    """
    n = batch.real_tokens
    if n == 0:
        raise SpecError("batch", batch.size, "has no real target tokens")
    return n
