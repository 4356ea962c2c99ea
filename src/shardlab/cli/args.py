"""argparse with one-line errors and value types that name the flag and what it allows."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, NoReturn

from shardlab.config.resolve import model_or_flags


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def positive_int(text: str) -> int:
    """An integer >= 1 (``"8"``; also ``"1e3"`` when it is a whole number)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return int(value)


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    return 0 if text.strip() in ("0", "0.0") else positive_int(text)


def positive_float(text: str) -> float:
    """A finite number > 0, scientific notation welcome (``"7.5e9"``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return value


def nonneg_float(text: str) -> float:
    """A finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1]")
    return value


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The model-shape flags shared with ``train``: a small model built from flags."""
    g = p.add_argument_group("model shape (when no MODEL is given)")
    g.add_argument("--style", choices=("gpt", "llama"), default="llama")
    g.add_argument("--layers", type=positive_int, default=4)
    g.add_argument("--d-model", type=positive_int, default=64)
    g.add_argument("--heads", type=positive_int, default=4)
    g.add_argument("--kv-heads", type=positive_int, help="default: heads (no GQA)")
    g.add_argument("--d-ff", type=positive_int, help="default 4 x d-model")
    g.add_argument("--vocab", type=positive_int,
                   help="default: the garden corpus's vocabulary size")
    g.add_argument("--seq", type=positive_int, default=32, help="tokens per sequence")


def build_shape(args: argparse.Namespace, corpus_vocab: int) -> Any:
    """MODEL (catalog or config.json), or the shape :func:`add_shape_args`' flags describe
    (:func:`shardlab.config.resolve.model_or_flags`)."""
    return model_or_flags(args.model, corpus_vocab, style=args.style, layers=args.layers,
                          d_model=args.d_model, heads=args.heads, kv_heads=args.kv_heads,
                          d_ff=args.d_ff, vocab=args.vocab, seq=args.seq)
