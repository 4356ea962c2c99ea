"""The ring all-reduce run literally, chunk by chunk, to check VirtualGroup's results and bytes."""

from __future__ import annotations

import torch
from torch import Tensor

from shardlab.sim.algorithms import TrafficPlan, alpha_beta
from shardlab.sim.virtual_group import VirtualGroup, check_alike, check_tensors, nbytes


def ring_all_reduce_steps(xs: list[Tensor], group: VirtualGroup | None = None) -> list[Tensor]:
    """Ring all-reduce run step by step, for teaching and for checking VirtualGroup.

    Each member keeps its own copy of its flattened tensor as p chunks
    (``tensor_split``). Reduce-scatter phase, steps s = 0..p-2: member r sends chunk
    (r - s) mod p to member r+1, which adds it to its own; afterwards member r holds
    the full sum of chunk (r+1) mod p. All-gather phase, steps s = 0..p-2: member r
    sends chunk (r + 1 - s) mod p to r+1, which keeps it. Each member sends 2(p-1)
    chunks (Patarasuk & Yuan 2009). The sums are accumulated in ring order, so in
    floating point they may differ from the direct sum in the last bits.

    With ``group`` (same size as ``xs``), the bytes of every chunk actually moved are
    recorded as one ``all_reduce`` call with the ring's alpha-beta time, whatever the
    group's algorithm: the same entries ``group.all_reduce`` makes for a ring.
    """
    op = "all_reduce"
    p = len(xs)
    if p == 0:
        raise ValueError("ring_all_reduce_steps: needs at least one tensor")
    if group is not None:
        group.check_members(xs, op)
    check_tensors(xs, op)
    check_alike(xs, op)
    shape = xs[0].shape
    chunks = [list(torch.tensor_split(x.flatten().clone(), p)) for x in xs]
    sent, recv, msgs = [0] * p, [0] * p, [0] * p

    def step(owned: int, reduce: bool) -> None:
        # Every member sends at once: take all outgoing chunks before any lands.
        outgoing = [(r, (r + owned) % p, chunks[r][(r + owned) % p].clone()) for r in range(p)]
        for r, c, data in outgoing:
            dst = (r + 1) % p
            chunks[dst][c] = chunks[dst][c] + data if reduce else data
            sent[r] += nbytes(data)
            recv[dst] += nbytes(data)
            msgs[r] += 1

    for s in range(p - 1):
        step(-s, reduce=True)
    for s in range(p - 1):
        step(1 - s, reduce=False)
    out = [torch.cat(c).view(shape) for c in chunks]
    if group is not None and p > 1:
        group.record(op, TrafficPlan(sent, recv, msgs),
                     alpha_beta(group.link, 2 * (p - 1), max(sent)))
    return out
