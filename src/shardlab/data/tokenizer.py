"""A Hugging Face ``tokenizer.json``, read and checked before anything is tokenized.

:func:`load_tokenizer` refuses, as one :class:`~shardlab.errors.SpecError` naming the
file: a missing or special file (a FIFO, ``/dev/zero``), one over
:data:`MAX_TOKENIZER_BYTES`, bytes that are not UTF-8 JSON, JSON that is not a tokenizer
(no ``model`` object), and whatever ``tokenizers`` itself cannot load. The file is only
ever parsed as JSON (there is nothing to unpickle in it).

It also decides whether :class:`shardlab.data.encode.Encoder` may cache encodings by
space-separated chunk (:func:`cache_refusal`): that is exact only for byte-level BPEs
whose pre-tokenizer starts a new piece at every space followed by a visible character
(GPT-2's ``ByteLevel`` regex, the Llama-3 / cl100k and Qwen2 split patterns), with no
normalizer, no BPE dropout, and no added token that holds a space or strips the
whitespace beside it. Any other tokenizer is run as ``tokenizers`` runs it, document by
document (slower, just as exact).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from shardlab.errors import SpecError

MAX_TOKENIZER_BYTES = 256 * 2**20
"""The largest tokenizer.json read (256 MiB). Real ones are far smaller (GPT-2's is
1.4 MB, Llama-3's 9 MB, Gemma's 34 MB); a larger file is not a tokenizer."""

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
"""Llama-3's pre-tokenizer pattern (also OpenAI's cl100k)."""
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
"""Qwen2's: Llama-3's with one digit per piece."""
CACHED_SPLITS = (LLAMA3_SPLIT, QWEN2_SPLIT)
"""Split patterns after which every space followed by a visible character starts a new
piece, whatever precedes it: none of their alternatives holds a space except at its
start or inside a run of whitespace, and a run of whitespace never ends with a space
that is followed by a visible character (``\\s+(?!\\S)`` backs off it)."""


@dataclass(frozen=True)
class TokenizerFile:
    """A checked tokenizer.json: its text, SHA-256 and vocabulary, the end-of-document
    token to append (if any), and how :class:`~shardlab.data.encode.Encoder` will run it.

    ``vocab_size`` is the largest id + 1 (added tokens included): the smallest embedding
    the data fits. ``prefix`` and ``suffix`` are the ids the tokenizer's post-processor
    puts around every document (Llama-3's ``<|begin_of_text|>``; none for GPT-2).
    ``cached`` is "" when the chunk cache applies, else the reason it does not.
    """

    path: str
    text: str
    sha256: str
    vocab_size: int
    eos: str | None
    eos_id: int | None
    cached: str
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    def build(self) -> Tokenizer:
        """A fresh ``tokenizers.Tokenizer`` of this file, truncation and padding off (a
        tokenizer.json may ask for both; training data must be neither cut nor padded)."""
        tok = Tokenizer.from_str(self.text)
        tok.no_truncation()
        tok.no_padding()
        return tok


def _read(path: str) -> bytes:
    """The file's bytes: a regular, non-empty file of at most MAX_TOKENIZER_BYTES."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise SpecError("tokenizer", path, "must be a tokenizer.json file (this is a "
                            "folder or a special file)")
        if info.st_size > MAX_TOKENIZER_BYTES:
            raise SpecError("tokenizer", path, f"is {info.st_size:,} bytes; a tokenizer.json "
                            f"is at most {MAX_TOKENIZER_BYTES:,}")
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpecError("tokenizer", path, f"must be a readable tokenizer.json "
                        f"({e.strerror or e})") from None
    if not data:
        raise SpecError("tokenizer", path, "is empty")
    return data


def _parse(path: str, data: bytes) -> tuple[str, dict[str, Any]]:
    """The file's text and JSON object, checked to look like a tokenizer.json."""
    try:
        text = data.decode("utf-8")
        doc = json.loads(text)
    except UnicodeDecodeError as e:
        raise SpecError("tokenizer", path, f"is not UTF-8 JSON (byte {e.start})") from None
    except ValueError as e:
        raise SpecError("tokenizer", path, f"is not JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise SpecError("tokenizer", path, "is not a Hugging Face tokenizer.json (it has no "
                        "`model` object)")
    return text, doc


def load_tokenizer(path: str | os.PathLike[str], eos: str | None = None) -> TokenizerFile:
    """The checked :class:`TokenizerFile` of ``path``; ``eos``, when given, must be one of
    its tokens (its id is appended to every document)."""
    shown = str(path)
    data = _read(shown)
    text, doc = _parse(shown, data)
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises plain Exceptions from Rust
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise SpecError("tokenizer", shown, f"is not a tokenizer `tokenizers` can load "
                        f"({first[:200]})") from None
    tok.no_truncation()
    tok.no_padding()
    vocab = tok.get_vocab(with_added_tokens=True)
    if not vocab:
        raise SpecError("tokenizer", shown, "has an empty vocabulary")
    eos_id = None
    if eos is not None:
        eos_id = tok.token_to_id(eos)
        if eos_id is None:
            specials = [t["content"] for t in doc.get("added_tokens") or []
                        if isinstance(t, dict) and t.get("special")][:5]
            known = f" (its special tokens: {', '.join(specials)})" if specials else ""
            raise SpecError("eos", eos, f"is not a token of {shown}{known}")
    refusal = cache_refusal(doc)
    affixes = _affixes(tok)
    if affixes is None:
        refusal = refusal or "its post-processor does not put fixed ids around a document"
    prefix, suffix = affixes or ((), ())
    return TokenizerFile(path=shown, text=text, sha256=hashlib.sha256(data).hexdigest(),
                         vocab_size=max(vocab.values()) + 1, eos=eos, eos_id=eos_id,
                         cached=refusal, prefix=prefix, suffix=suffix)


def cache_refusal(doc: dict[str, Any]) -> str:
    """"" when the chunk cache is exact for the tokenizer.json ``doc`` (see the module
    docstring), else why it is not."""
    model = doc.get("model") or {}
    if model.get("type") != "BPE":
        return f"its model is {model.get('type')!r}, not BPE"
    if model.get("dropout") not in (None, 0, 0.0):
        return "it has BPE dropout (random encodings)"
    if doc.get("normalizer") is not None:
        return "it has a normalizer"
    if not _chunk_safe_pre_tokenizer(doc.get("pre_tokenizer")):
        return "its pre-tokenizer is not GPT-2's, Llama-3's or Qwen2's byte-level split"
    for t in doc.get("added_tokens") or []:
        if not isinstance(t, dict) or not isinstance(t.get("content"), str):
            return "an added token has no content"
        if any(c.isspace() for c in t["content"]) or t.get("lstrip") or t.get("rstrip"):
            return f"its added token {t['content']!r} holds or strips whitespace"
    return ""


def _chunk_safe_pre_tokenizer(pre: Any) -> bool:
    """GPT-2's ByteLevel (its own regex, no prefix space), or a Split by one of
    :data:`CACHED_SPLITS` followed by a ByteLevel without regex or prefix space."""
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "ByteLevel":
        return pre.get("use_regex", True) is True and not pre.get("add_prefix_space")
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers") or []) != 2:
        return False
    split, byte_level = pre["pretokenizers"]
    return (isinstance(split, dict) and isinstance(byte_level, dict)
            and split.get("type") == "Split" and split.get("behavior") == "Isolated"
            and not split.get("invert")
            and (split.get("pattern") or {}).get("Regex") in CACHED_SPLITS
            and byte_level.get("type") == "ByteLevel" and byte_level.get("use_regex") is False
            and not byte_level.get("add_prefix_space"))


def _affixes(tok: Tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids the post-processor puts before and after a document (the same for two
    probes), or None when it does something else."""
    found = set()
    for probe in ("a", "b c"):
        plain = tok.encode(probe, add_special_tokens=False).ids
        full = tok.encode(probe, add_special_tokens=True).ids
        starts = [i for i in range(len(full) - len(plain) + 1)
                  if plain and full[i:i + len(plain)] == plain]
        if not starts:
            return None
        i = starts[0]
        found.add((tuple(full[:i]), tuple(full[i + len(plain):])))
    return found.pop() if len(found) == 1 else None
