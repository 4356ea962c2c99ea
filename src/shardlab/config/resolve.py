"""The one way to name a model: a catalog name, a Hugging Face ``config.json`` (or the
folder that holds it), or shape flags, turned into a :class:`ModelShape`. Every command
that takes a model goes through here (``budget``, ``plan``, ``simulate``, ``train``,
``report``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shardlab.config.catalog import get_model
from shardlab.config.files import check_input_file
from shardlab.config.hf_config import shape_from_hf_config
from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError

FLAGS_NAME = "flags"
"""The name of a model built from the shape flags (``--layers``, ``--d-model``, ...), as the
JSON documents and ``shardlab train`` know it. Messages do not echo it (the user typed no
such name): they name the shape flags instead (:func:`model_field`)."""


def model_field(shape: ModelShape) -> tuple[str, str]:
    """(field, value) an error line names ``shape`` by: ``("model", its name)``, or for a
    model built from the shape flags ``("shape flags", its one-line description)``."""
    if shape.name == FLAGS_NAME:
        return "shape flags", shape.describe()
    return "model", shape.name


def model_label(shape: ModelShape) -> str:
    """``shape`` in a sentence: its name, or "the model of the shape flags"."""
    return "the model of the shape flags" if shape.name == FLAGS_NAME else shape.name


def _stat(path: Path) -> os.stat_result | None:
    """What ``path`` names on disk, or None when nothing; a name the system cannot even look
    up (too long, say) is a SpecError rather than an OSError."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise SpecError("model", str(path), f"is neither a catalog name nor a readable path "
                        f"({e.strerror or e})") from None


def load_model(name: str) -> ModelShape:
    """A catalog name, or a path to a config.json (an existing path, or a name ending .json;
    a folder means its config.json). The file must be a regular file of at most
    :data:`~shardlab.config.limits.MAX_FILE_BYTES` (:func:`check_input_file`)."""
    if not name.strip():
        raise SpecError("model", name, "must name a catalog model or a config.json")
    path = Path(name)
    st = _stat(path)
    if path.suffix == ".json" or st is not None:
        if st is not None and stat.S_ISDIR(st.st_mode):
            path = path / "config.json"
        return shape_from_hf_config(check_input_file("config", path))
    return get_model(name)


def model_or_flags(model: str | None, corpus_vocab: int, *, style: str, layers: int,
                   d_model: int, heads: int, kv_heads: int | None, d_ff: int | None,
                   vocab: int | None, seq: int, experts: int = 0, top_k: int = 2,
                   expert_d_ff: int | None = None, shared_experts: int = 0,
                   dense_layers: int = 0, qk_norm: bool = False) -> ModelShape:
    """``model`` (catalog or config.json) when given, else the shape the flags describe,
    named :data:`FLAGS_NAME` (kv_heads and d_ff default to the style's, vocab to the corpus's; gpt
    ties its head). Either way the vocabulary must hold the corpus's ``corpus_vocab``
    words. ``experts`` > 0 makes every layer past ``dense_layers`` a mixture-of-experts
    layer: ``top_k`` of ``experts`` routed experts of width ``expert_d_ff`` (default the
    dense d_ff) and ``shared_experts`` always-on ones; ``qk_norm`` adds Qwen3's per-head
    query/key norms."""
    if model is not None:
        shape = load_model(model)
        if shape.vocab < corpus_vocab:
            raise SpecError("vocab", shape.vocab, f"must be >= the corpus's {corpus_vocab} words")
        return shape
    if vocab is not None and vocab < corpus_vocab:
        raise SpecError("vocab", vocab, f"must be >= the corpus's {corpus_vocab} words")
    moe = None
    if experts:
        if top_k > experts:
            raise SpecError("top_k", top_k, f"must be <= experts ({experts})")
        moe = MoE(experts=experts, experts_per_token=top_k,
                  expert_d_ff=expert_d_ff or d_ff or 4 * d_model,
                  shared_experts=shared_experts, dense_layers=dense_layers)
    else:
        for name, value in (("shared_experts", shared_experts), ("dense_layers", dense_layers),
                            ("expert_d_ff", expert_d_ff)):
            if value:
                raise SpecError(name, value, "needs --experts > 0 (a mixture-of-experts model)")
    return ModelShape(FLAGS_NAME, layers, d_model, heads, vocab or corpus_vocab, seq,
                      kv_heads=kv_heads or 0, d_ff=d_ff or 0, style=style,
                      tied=style == "gpt", moe=moe, qk_norm=qk_norm)
