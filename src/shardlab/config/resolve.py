"""The one way to name a model: a catalog name, a Hugging Face ``config.json`` (or the
folder that holds it), or shape flags, turned into a :class:`ModelShape`. Every command
that takes a model goes through here (``budget``, ``plan``, ``simulate``, ``train``,
``report``)."""

from __future__ import annotations

from pathlib import Path

from shardlab.config.catalog import get_model
from shardlab.config.hf_config import shape_from_hf_config
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError


def load_model(name: str) -> ModelShape:
    """A catalog name, or a path to a config.json (an existing path, or a name ending .json;
    a folder means its config.json)."""
    if not name.strip():
        raise SpecError("model", name, "must name a catalog model or a config.json")
    path = Path(name)
    if path.suffix == ".json" or path.exists():
        if path.is_dir():
            path = path / "config.json"
        return shape_from_hf_config(path)
    return get_model(name)


def model_or_flags(model: str | None, corpus_vocab: int, *, style: str, layers: int,
                   d_model: int, heads: int, kv_heads: int | None, d_ff: int | None,
                   vocab: int | None, seq: int) -> ModelShape:
    """``model`` (catalog or config.json) when given, else the shape the flags describe,
    named "flags" (kv_heads and d_ff default to the style's, vocab to the corpus's; gpt
    ties its head). Either way the vocabulary must hold the corpus's ``corpus_vocab``
    words."""
    if model is not None:
        shape = load_model(model)
        if shape.vocab < corpus_vocab:
            raise SpecError("vocab", shape.vocab, f"must be >= the corpus's {corpus_vocab} words")
        return shape
    if vocab is not None and vocab < corpus_vocab:
        raise SpecError("vocab", vocab, f"must be >= the corpus's {corpus_vocab} words")
    return ModelShape("flags", layers, d_model, heads, vocab or corpus_vocab, seq,
                      kv_heads=kv_heads or 0, d_ff=d_ff or 0, style=style,
                      tied=style == "gpt")
