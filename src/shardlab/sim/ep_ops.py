"""Expert parallel's all-to-all as an autograd function over devices.

Like :mod:`.tp_ops`, it takes one tensor per member and returns one per member, so a
single autograd graph holds every virtual device. Its conjugate is itself with the
splits transposed (dispatch and combine, GShard: Lepikhin et al. 2020):

========================  ==================================  ==============================
operator                  forward                             backward
========================  ==================================  ==============================
``all_to_all_autograd``   rows ``splits[i][j]`` of i to j     rows ``splits[i][j]`` of j's
                                                              gradient back to i (the
                                                              reverse all-to-all)
========================  ==================================  ==============================

The reverse exchange is counted too: a backward's dispatch gradient is a combine, and its
combine gradient a dispatch, so a MoE layer sends its routed rows four times per
micro-batch (forward and backward, dispatch and combine), as
:func:`shardlab.estimate.expert.expert_alltoall_bytes` counts.
"""

from __future__ import annotations

from typing import Any

import torch

from shardlab.sim.virtual_group import VirtualGroup

Splits = list[list[int]]


def transpose(splits: Splits) -> Splits:
    """The splits of the reverse exchange: what j received from i, j now sends back to i."""
    return [list(col) for col in zip(*splits, strict=True)]


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, group: VirtualGroup, splits: Splits,
                *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group, ctx.splits = group, splits
        return tuple(group.all_to_all_single(list(xs), splits))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        back = ctx.group.all_to_all_single([g.contiguous() for g in grads],
                                           transpose(ctx.splits))
        return (None, None, *back)


def all_to_all_autograd(group: VirtualGroup, xs: list[torch.Tensor],
                        splits: Splits) -> list[torch.Tensor]:
    """:meth:`VirtualGroup.all_to_all_single` whose backward is the reverse all-to-all
    (torch's ``all_to_all_single_autograd`` does the same across processes). A group of
    one moves nothing and records nothing."""
    if group.size == 1:
        return list(xs)
    return list(_AllToAll.apply(group, splits, *xs))
