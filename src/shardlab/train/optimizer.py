"""The update every run makes, on shards and whole tensors alike: AdamW, its warm-up +
cosine learning-rate schedule, and clipping by the norm of the whole model's gradient."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from shardlab.distributed.measure import comm_label
from shardlab.train.config import TrainConfig


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine down to ``min_lr_ratio``
    at the last step (Loshchilov & Hutter 2017, as in nanoGPT and torchtitan)."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(params: list[Any], cfg: TrainConfig) -> tuple[Any, Any]:
    """AdamW (single-tensor path: the same arithmetic on shards and whole tensors) and its
    warm-up + cosine schedule."""
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=cfg.weight_decay, foreach=False)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))


def clip_grad_norm(params: list[Any], max_norm: float, pp_group: Any = None,
                   copies: tuple[Any, ...] = ()) -> torch.Tensor:
    """Clip by the norm of the gradient of the *whole* model (torchtitan's clip_grad_norm_).

    Squares of every rank's local gradient norms are summed in float64 per sharding:
    plain tensors and DTensor dims that are ``Replicate`` hold the same numbers on every
    rank of that dim, so only the dims that split the elements (``Shard``, FSDP's
    ``_StridedShard``) are summed over, by one scalar all-reduce per group of such dims,
    then over the pipeline stages. Those scalars are filed as ``grad_norm`` by the comm meter.
    ``copies``: parameters whose gradient another stage holds too (the last stage's copy of
    a tied embedding, equal to the first's after ``sync_tied_grads``): clipped, but counted
    once in the norm. Returns the norm as a 0-dim float64 tensor, and never reads a value
    (the clip factor multiplies every gradient, 1.0 when under ``max_norm``, exact in IEEE
    arithmetic), so a dry run on fake tensors takes the same path.
    """
    grads = [p.grad for p in params if p.grad is not None]
    skip = {id(p.grad) for p in copies if p.grad is not None}
    squares: dict[tuple[str, ...], Any] = {}
    groups: dict[tuple[str, ...], list[Any]] = {}
    for g in grads:  # FSDP/TP shards (DTensor) and replicated plain tensors side by side
        if id(g) in skip:
            continue
        local, key = g.detach(), ()
        if isinstance(local, DTensor):
            # Every dim but Replicate splits the elements (FSDP over a TP shard of the
            # same tensor dim is _StridedShard, which is_shard() does not report).
            mesh, dims = local.device_mesh, [i for i, p in enumerate(local.placements)
                                             if not p.is_replicate()]
            key = tuple(mesh.get_group(i).group_name for i in dims)
            groups[key] = [mesh.get_group(i) for i in dims]
            local = local.to_local()
        # The norm in the gradient's own dtype (torch's reduction accumulates it in
        # cascade), squared in float64 to sum across tensors and ranks, as torchtitan's
        # get_total_norm: a float64 copy of each gradient and its square would be a
        # transient of 4x the largest gradient's fp32 bytes, which the dry run of an
        # unsharded model showed as the step's largest temporary.
        square = torch.linalg.vector_norm(local, 2).double() ** 2
        squares[key] = squares[key] + square if key in squares else square
    total_sq = torch.zeros((), dtype=torch.float64)
    with comm_label("grad_norm"):
        for key, value in sorted(squares.items()):
            for group in groups.get(key, []):
                dist.all_reduce(value, group=group)
            total_sq += value
        if pp_group is not None:
            dist.all_reduce(total_sq, group=pp_group)
    total = total_sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        # The local part of a DTensor in place: a plain 0-dim factor, no DTensor dispatch.
        (g.to_local() if isinstance(g, DTensor) else g).detach().mul_(coef)
    return total
