"""Tensor-parallel sharding of the LM's named parameters (Megatron-LM's layout).

Column-parallel (split the output rows): ``q_proj``, ``k_proj``, ``v_proj`` by whole
heads, ``gate_proj`` and ``up_proj`` by hidden units, and their biases. Row-parallel
(split the input columns): ``o_proj``, ``down_proj``; their biases are added once,
after the reduction, so every rank holds them whole. Norms, the embedding, the
positions and the head stay whole on every rank (shardlab's simulator does not split
the vocabulary). Rank t of T holds the t-th of T contiguous slices: q heads
[t·H/T, (t+1)·H/T) and kv heads [t·K/T, (t+1)·K/T), which keeps grouped-query heads
with their own kv head.
"""

from __future__ import annotations

import torch

COLUMN = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight",
          "up_proj.weight", "q_proj.bias", "k_proj.bias", "v_proj.bias", "up_proj.bias")
ROW = ("o_proj.weight", "down_proj.weight")


def split_dim(name: str) -> int | None:
    """The dimension ``name`` is split along under tensor parallelism, or None if whole."""
    if name.endswith(COLUMN):
        return 0
    if name.endswith(ROW):
        return 1
    return None


EXPERTS = ".mlp.experts."


def is_expert(name: str) -> bool:
    """A routed expert's grouped parameter (sharded over ep, its state over expert_dp)."""
    return EXPERTS in name


def shard(name: str, full: torch.Tensor, rank: int, tp: int, ep_rank: int = 0,
          ep: int = 1) -> torch.Tensor:
    """Tensor rank ``rank``'s (and for a routed expert, ep rank ``ep_rank``'s) slice of
    parameter ``name``: a fresh tensor, whole if replicated."""
    if is_expert(name):
        return full.detach().chunk(ep, dim=0)[ep_rank].clone()
    dim = split_dim(name)
    if dim is None or tp == 1:
        return full.detach().clone()
    return full.detach().chunk(tp, dim=dim)[rank].clone()


def unshard(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """The full parameter from every tensor rank's slice (the first rank's copy if
    replicated); a routed expert's ``parts`` are its ep ranks' slices instead."""
    dim = 0 if is_expert(name) else split_dim(name)
    if dim is None or len(parts) == 1:
        return parts[0].detach().clone()
    return torch.cat([p.detach() for p in parts], dim=dim)


def replicated_under_sp(name: str) -> bool:
    """Block parameters whose gradient is partial under sequence parallelism (norms and the
    row-parallel biases, which see only their rank's part of the sequence)."""
    return name.startswith("blocks.") and ("norm" in name or name.endswith(
        ("o_proj.bias", "down_proj.bias")))


HEAD_NORMS = ("attn.q_norm.weight", "attn.k_norm.weight")


def partial_over_heads(name: str) -> bool:
    """Qwen3's query/key norm weights: shared by every head, so under tensor parallelism
    each rank's gradient sums over its own heads only, with or without sequence
    parallelism (their sum over the tensor ranks is the gradient)."""
    return name.endswith(HEAD_NORMS)
