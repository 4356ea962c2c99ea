"""Megatron-LM's tensor-parallel communication operators as autograd functions over devices.

Each function takes one tensor per tensor-parallel rank and returns one per rank, so a
single autograd graph holds every virtual device. The loss of the step is the sum of
the ranks' (identical) losses; with these conjugate pairs every rank's gradients are
then exactly the single-device gradients of its own parameters (Shoeybi et al. 2019,
Sec. 3, operators f and g; Korthikanti et al. 2022, Sec. 4.2.2, for g-bar and f-bar):

=======================  =========================  ===========================
operator                 forward                    backward
=======================  =========================  ===========================
``copy_to_tp`` (f)       identity                   all-reduce
``reduce_from_tp`` (g)   all-reduce                 identity
``gather_seq`` (f-bar)   all-gather along sequence  reduce-scatter along sequence
``reduce_scatter_seq``   reduce-scatter along seq.  all-gather along sequence
``split_seq``            keep own sequence chunk    all-gather along sequence
``gather_seq_whole``     all-gather along sequence  keep own sequence chunk
=======================  =========================  ===========================

Tensors are [batch, seq, hidden]; sequence collectives move dim 1 to the front for
the group (whose collectives work along dim 0) and back.
"""

from __future__ import annotations

from typing import Any

import torch

from shardlab.sim.virtual_group import VirtualGroup

Tensors = list[torch.Tensor]


def _seq_first(xs: Tensors) -> Tensors:
    return [x.transpose(0, 1).contiguous() for x in xs]


def _seq_back(xs: Tensors) -> Tensors:
    return [x.transpose(0, 1) for x in xs]


def _all_reduce(g: VirtualGroup, xs: Tensors) -> Tensors:
    return g.all_reduce(list(xs))


def _all_gather_seq(g: VirtualGroup, xs: Tensors) -> Tensors:
    return _seq_back(g.all_gather(_seq_first(xs)))


def _reduce_scatter_seq(g: VirtualGroup, xs: Tensors) -> Tensors:
    return _seq_back(g.reduce_scatter(_seq_first(xs)))


def _own_chunks(g: VirtualGroup, xs: Tensors) -> Tensors:
    return [x.tensor_split(g.size, dim=1)[i].contiguous() for i, x in enumerate(xs)]


def _identity(g: VirtualGroup, xs: Tensors) -> Tensors:
    return [x.clone() for x in xs]


def _make(name: str, forward: Any, backward: Any) -> Any:
    """An autograd Function whose forward and backward apply the given collectives."""

    def fwd(ctx: Any, group: VirtualGroup, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        return tuple(forward(group, list(xs)))

    def bwd(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        return (None, *backward(ctx.group, list(grads)))

    cls = type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd),
                                                  "backward": staticmethod(bwd)})
    return cls.apply


_COPY = _make("CopyToTP", _identity, _all_reduce)
_REDUCE = _make("ReduceFromTP", _all_reduce, _identity)
_GATHER_SEQ = _make("GatherSeq", _all_gather_seq, _reduce_scatter_seq)
_REDUCE_SCATTER_SEQ = _make("ReduceScatterSeq", _reduce_scatter_seq, _all_gather_seq)
_SPLIT_SEQ = _make("SplitSeq", _own_chunks, _all_gather_seq)
_GATHER_SEQ_WHOLE = _make("GatherSeqWhole", _all_gather_seq, _own_chunks)


def _apply(op: Any, group: VirtualGroup, xs: Tensors) -> Tensors:
    if group.size == 1:  # nothing to talk to: no op, no bytes
        return list(xs)
    return list(op(group, *xs))


def copy_to_tp(group: VirtualGroup, xs: Tensors) -> Tensors:
    """f: enter a column-parallel region (gradients all-reduced on the way back)."""
    return _apply(_COPY, group, xs)


def reduce_from_tp(group: VirtualGroup, xs: Tensors) -> Tensors:
    """g: leave a row-parallel region, summing the partial outputs."""
    return _apply(_REDUCE, group, xs)


def gather_seq(group: VirtualGroup, xs: Tensors) -> Tensors:
    """Sequence parallel's entry into a column-parallel region (all-gather the sequence)."""
    return _apply(_GATHER_SEQ, group, xs)


def reduce_scatter_seq(group: VirtualGroup, xs: Tensors) -> Tensors:
    """Sequence parallel's exit from a row-parallel region (sum, keep own sequence chunk)."""
    return _apply(_REDUCE_SCATTER_SEQ, group, xs)


def split_seq(group: VirtualGroup, xs: Tensors) -> Tensors:
    """Replicated activations -> each rank's sequence chunk (the embedding's output)."""
    return _apply(_SPLIT_SEQ, group, xs)


def gather_seq_whole(group: VirtualGroup, xs: Tensors) -> Tensors:
    """Sequence chunks -> the whole sequence on every rank (before a replicated head)."""
    return _apply(_GATHER_SEQ_WHOLE, group, xs)
