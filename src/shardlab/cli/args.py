"""argparse with one-line errors and value types that name the flag and what it allows."""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Any, NoReturn

from shardlab.config.limits import MAX_PARAMS
from shardlab.config.resolve import model_or_flags
from shardlab.errors import SHOWN_CHARACTERS, SpecError, clip


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        # argparse echoes what was typed (an invalid choice, unrecognized arguments): cut
        # any over-long word of it so the line stays readable.
        message = re.sub(rf"\S{{{SHOWN_CHARACTERS + 20},}}", lambda m: clip(m.group()), message)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _number(text: str) -> float:
    """``text`` as a float, or an ArgumentTypeError that echoes it (cut to a readable
    length, :func:`shardlab.errors.clip`)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{clip(repr(text))} is not a number") from None


def _integer(text: str, low: int) -> int:
    """A whole number >= ``low`` (``"8"``, exactly however long; also ``"1e3"``)."""
    try:
        value: float = int(text)
    except ValueError:
        value = _number(text)
    if not math.isfinite(value) or value != int(value) or value < low:
        need = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise argparse.ArgumentTypeError(f"{clip(repr(text))} must be {need}")
    return int(value)


def positive_int(text: str) -> int:
    """An integer >= 1 (``"8"``; also ``"1e3"`` when it is a whole number)."""
    return _integer(text, 1)


def positive_int_at_most(high: int) -> Any:
    """A type: an integer from 1 to ``high`` (a count whose output or time grows with it)."""
    def check(text: str) -> int:
        value = _integer(text, 1)
        if value > high:
            raise argparse.ArgumentTypeError(f"{clip(repr(text))} must be at most {high:,}")
        return value
    check.kind = int  # type: ignore[attr-defined]  # a job file's key holds an integer
    return check


def nonneg_int(text: str) -> int:
    """An integer >= 0 (``"0"``, ``"8"``; also ``"1e3"``)."""
    return _integer(text, 0)


def positive_float(text: str) -> float:
    """A finite number > 0, scientific notation welcome (``"7.5e9"``)."""
    value = _number(text)
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"{clip(repr(text))} must be a finite number > 0")
    return value


def nonneg_float(text: str) -> float:
    """A finite number >= 0."""
    value = _number(text)
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"{clip(repr(text))} must be a finite number >= 0")
    return value


def number_in(low: float, high: float) -> Any:
    """A type: a number from ``low`` to ``high`` (an assumption whose extremes only
    overflow or print nonsense: a price of 1e308, an MFU of 1e-300)."""
    def check(text: str) -> float:
        value = _number(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{clip(repr(text))} must be from {low:g} to "
                                             f"{high:g}")
        return value
    check.kind = float  # type: ignore[attr-defined]  # a job file's key holds a number
    return check


_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def param_count(text: str) -> float:
    """A parameter count from 1 to :data:`~shardlab.config.limits.MAX_PARAMS`: a number
    (``"7.5e9"``) or one with a suffix K, M, B or T (``"7B"``, ``"1.5t"``, ``"125M"``)."""
    body = text.strip()
    scale = _SUFFIXES.get(body[-1:].lower(), 1.0) if body else 1.0
    if scale != 1.0:
        body = body[:-1]
    value = _number(body) * scale
    if not (1 <= value <= MAX_PARAMS):
        raise argparse.ArgumentTypeError(
            f"{clip(repr(text))} must be a parameter count from 1 to {MAX_PARAMS:.3g} (2^53), "
            "e.g. 7.5e9 or 7B (suffixes K, M, B, T)")
    return value


SHAPE_FLAGS = ("style", "layers", "d_model", "heads", "kv_heads", "d_ff", "vocab", "experts",
               "top_k", "expert_d_ff", "shared_experts", "dense_layers", "qk_norm")
"""The shape flags (:func:`add_shape_args`) that MODEL, or a config.json, replaces."""


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The model-shape flags shared with ``train``: a small model built from flags."""
    g = p.add_argument_group("model shape (when no MODEL is given)",
                             "at most 4,096 layers, d-model 2^20, heads 2^16, d-ff 2^22, "
                             "vocab and seq 2^24 (shardlab.config.limits)")
    g.add_argument("--style", choices=("gpt", "llama"), default="llama")
    g.add_argument("--layers", type=positive_int, default=4)
    g.add_argument("--d-model", type=positive_int, default=64)
    g.add_argument("--heads", type=positive_int, default=4)
    g.add_argument("--kv-heads", type=positive_int, help="default: heads (no GQA)")
    g.add_argument("--d-ff", type=positive_int, help="default 4 x d-model")
    g.add_argument("--qk-norm", action="store_true",
                   help="an RMSNorm over each head's query and key before rotary (Qwen3)")
    g.add_argument("--vocab", type=positive_int,
                   help="default: the garden corpus's vocabulary size")
    g.add_argument("--seq", type=positive_int, default=32, help="tokens per sequence")
    g.add_argument("--experts", type=nonneg_int, default=0,
                   help="routed experts per MoE layer (0: a dense model)")
    g.add_argument("--top-k", type=positive_int, default=2,
                   help="experts each token is routed to (MoE)")
    g.add_argument("--expert-d-ff", type=positive_int,
                   help="hidden width of one expert (default: d-ff)")
    g.add_argument("--shared-experts", type=nonneg_int, default=0,
                   help="always-on shared experts per MoE layer (DeepSeek style)")
    g.add_argument("--dense-layers", type=nonneg_int, default=0,
                   help="first layers that keep a dense MLP (MoE models)")
    # None marks a shape flag not given, so one given beside MODEL (or a config.json that
    # sets the shape) is refused instead of ignored (shape_flags); the stated defaults come
    # back when no MODEL is given.
    p.set_defaults(shape_defaults={f: p.get_default(f) for f in SHAPE_FLAGS},
                   **dict.fromkeys(SHAPE_FLAGS))


def shape_flags(args: argparse.Namespace, source: str | None) -> None:
    """Refuse a shape flag given beside ``source`` (MODEL, or --init-from's config.json:
    what sets the model's shape), rather than ignore it; fill in the flags' defaults
    otherwise. Once per command line (later calls do nothing)."""
    if getattr(args, "shape_flags_checked", False):
        return
    given = [f for f in SHAPE_FLAGS if getattr(args, f) is not None]
    if given and source is not None:
        f = given[0]
        raise SpecError(f, getattr(args, f), f"--{f.replace('_', '-')} cannot be combined "
                        f"with {source}, which sets the model's shape; leave it out")
    for f in SHAPE_FLAGS:
        if getattr(args, f) is None:
            setattr(args, f, args.shape_defaults[f])
    args.shape_flags_checked = True


def build_shape(args: argparse.Namespace, corpus_vocab: int) -> Any:
    """MODEL (catalog or config.json), or the shape :func:`add_shape_args`' flags describe
    (:func:`shardlab.config.resolve.model_or_flags`)."""
    return model_or_flags(args.model, corpus_vocab, style=args.style, layers=args.layers,
                          d_model=args.d_model, heads=args.heads, kv_heads=args.kv_heads,
                          d_ff=args.d_ff, vocab=args.vocab, seq=args.seq,
                          experts=args.experts, top_k=args.top_k,
                          expert_d_ff=args.expert_d_ff, shared_experts=args.shared_experts,
                          dense_layers=args.dense_layers, qk_norm=args.qk_norm)
