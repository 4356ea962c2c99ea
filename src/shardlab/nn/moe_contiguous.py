"""Contiguous routing: a forced-balanced router whose every count is known before it runs.

A learned router's counts (rows per expert) are data: the split sizes of the
expert-parallel all-to-alls and the experts' row counts come from the logits' values.
Benchmarks of MoE training force the routing instead, so that their step does not depend
on how well a router has learned to balance (Megatron-LM's
``--moe-router-force-load-balancing``; NeMo AutoModel's ``FakeBalancedGate``, commit
8d9bfb90e). shardlab's forced routing is NeMo AutoModel's: of the T tokens of one forward,
token t's slot j goes to expert

    (t·k + j) mod E

so the T·k assignments cycle through the E experts in order, each token's k experts are
distinct (k consecutive experts, k <= E), and expert e takes ``T·k // E`` assignments,
one more for the first ``T·k mod E`` experts. Its place in that expert's queue (token
order, as :func:`shardlab.nn.moe_capacity.capacity_keep` counts it) is ``(t·k + j) // E``, so a
capacity keeps the same assignments it would keep by counting. The weights are still the
router's (its float32 softmax at the forced experts, renormalised over the k, as
:func:`shardlab.nn.moe.route`), so the router is trained and its memory and FLOPs are
the learned router's.

Because the counts depend only on T, k and E, every rank of an expert-parallel group
knows what every other rank sends without the counts all-to-all, and a run on fake
tensors (``shardlab dryrun``, which has no values to route by) runs the same program:
the planner's balanced case (``routing=contiguous``, :mod:`shardlab.plan.expert_time`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def contiguous_ids(tokens: int, top_k: int, experts: int,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """ids [T, k]: token t's slot j takes expert (t·k + j) mod E."""
    return (torch.arange(tokens * top_k, device=device) % experts).view(tokens, top_k)


def contiguous_counts(tokens: int, top_k: int, experts: int) -> tuple[int, ...]:
    """Assignments per expert of :func:`contiguous_ids`: T·k // E, one more for the first
    T·k mod E experts."""
    whole, extra = divmod(tokens * top_k, experts)
    return tuple(whole + (e < extra) for e in range(experts))


def contiguous_keep(tokens: int, top_k: int, experts: int, capacity: int,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """bool [T, k]: the assignments within their expert's first ``capacity`` in token order
    (assignment a = t·k + j is the (a // E)-th of expert a mod E)."""
    a = torch.arange(tokens * top_k, device=device)
    return (a // experts < capacity).view(tokens, top_k)


def contiguous_weights(logits: torch.Tensor, ids: torch.Tensor,
                       float_dtype: torch.dtype) -> torch.Tensor:
    """The router's weights at the forced experts: softmax over all E in ``float_dtype``,
    taken at ``ids`` and renormalised over the k (as :func:`shardlab.nn.moe.route`), in
    the logits' dtype. logits [T, E], ids [T, k] -> [T, k]."""
    probs = F.softmax(logits.to(float_dtype), dim=-1).gather(-1, ids)
    return (probs / probs.sum(dim=-1, keepdim=True)).to(logits.dtype)


def capped(counts: tuple[int, ...], capacity: int | None) -> tuple[int, ...]:
    """Rows each expert takes of ``counts`` under ``capacity`` (None: all)."""
    return counts if capacity is None else tuple(min(c, capacity) for c in counts)
