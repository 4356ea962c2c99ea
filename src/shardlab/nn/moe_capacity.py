"""Capacity of a mixture-of-experts layer: how many assignments each expert takes from
one forward's tokens, and which ones it keeps (token dropping; GShard, Lepikhin et al.
2020; Switch Transformer, Fedus et al. 2021). :func:`shardlab.nn.moe.dispatch` applies
them."""

from __future__ import annotations

import math

import torch


def expert_capacity(tokens: int, top_k: int, experts: int, capacity_factor: float) -> int:
    """Most assignments one expert takes from ``tokens`` tokens of one forward on one
    rank: ceil(capacity_factor * tokens * top_k / experts) (GShard; Switch eq. 3)."""
    return math.ceil(capacity_factor * tokens * top_k / experts)


def capacity_keep(ids: torch.Tensor, experts: int, capacity: int) -> torch.Tensor:
    """Which assignments their expert keeps: the first ``capacity`` of each expert in
    token order (token t's slot j is assignment t*k + j). ids [T, k] -> bool [T, k].

    A dropped assignment gets weight 0 and never reaches its expert; the residual carries
    the token on (Switch, Fedus et al. 2021, sec. 2.2).
    """
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    starts = counts.cumsum(0) - counts
    rank_sorted = torch.arange(flat.numel(), device=ids.device) - starts[flat[order]]
    rank = torch.empty_like(rank_sorted)
    rank[order] = rank_sorted  # each assignment's place in its expert's queue, from 0
    return (rank < capacity).view_as(ids)
