"""Pipeline parallelism with ``torch.distributed.pipelining`` equals one process, in float64.

A tiny model, ``2·world`` blocks of ``Linear(16, 16)`` + ``GELU`` in an
``nn.Sequential``, is cut into ``world`` stages of two consecutive blocks; rank r
wraps stage r in ``PipelineStage(submodule, stage_index=r, num_stages=world, device)``
(shapes inferred at run time, P2P on the default group) and runs one ``step`` of
``ScheduleGPipe`` (all forwards, then all backwards) and, on a freshly built copy,
of ``Schedule1F1B`` (one forward, one backward in the steady state), each with
``n_microbatches = 2·world`` (1F1B needs at least ``world``) and
``loss_fn = F.mse_loss``. The first stage gets the whole batch (the schedule splits
it along dim 0), the last stage the targets and ``losses=[]``.

Every rank also builds the unsharded model (same seeded init) and, as a single
process, computes each micro-batch's loss on ``x.chunk(n)`` and back-propagates their
mean: the schedules' default ``scale_grads=True`` divides the accumulated gradients
by ``n_microbatches``, which is the gradient of that mean. The checks, float64 with
tolerance 1e-10, compare:

* the last stage's per-micro-batch losses (the list ``step`` fills) with the
  reference losses, one by one, and their number with ``n_microbatches``;
* the last stage's merged output (what ``step`` returns) with the reference forward;
* every stage's weight and bias gradients with the reference's gradients of the
  same blocks (``nn.Sequential`` slicing keeps the parameter names), worst stage.

Losses, output differences and gradient differences travel to every rank with
``dist.all_gather_object``, so all ranks, rank 0 included, report the same checks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from shardlab.distributed.launch import RankContext
from shardlab.verify.registry import check

DTYPE = torch.float64
TOLERANCE = 1e-10  # float64; stage and reference run the same ops, so diffs are ~0
WIDTH, ROWS_PER_MICROBATCH, SEED = 16, 2, 7


def build(world: int) -> nn.Sequential:
    """``2·world`` blocks of Linear + GELU, deterministically initialised from ``SEED``."""
    gen = torch.Generator().manual_seed(SEED)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, WIDTH, dtype=DTYPE), nn.GELU())
                            for _ in range(2 * world)))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=DTYPE) * WIDTH ** -0.5)
    return model


def stage_of(model: nn.Sequential, rank: int, world: int) -> nn.Sequential:
    """Rank ``rank``'s consecutive blocks; the slice keeps the full model's names."""
    per = len(model) // world
    return model[rank * per:(rank + 1) * per]


def _run_schedule(ctx: RankContext, schedule_cls: type, x: torch.Tensor, y: torch.Tensor,
                  n_micro: int, ref: nn.Sequential) -> dict[str, Any]:
    """One ``step`` of ``schedule_cls`` on this rank's stage; this rank's numbers."""
    rank, world = ctx.rank, ctx.world_size
    device = torch.device(ctx.device)
    submodule = stage_of(build(world).to(device), rank, world)
    stage = PipelineStage(submodule, stage_index=rank, num_stages=world, device=device)
    schedule = schedule_cls(stage, n_microbatches=n_micro, loss_fn=F.mse_loss)
    first, last = rank == 0, rank == world - 1
    losses: list[torch.Tensor] = []
    args = (x,) if first else ()
    kwargs: dict[str, Any] = {"target": y, "losses": losses} if last else {}
    out = schedule.step(*args, **kwargs)

    ref_params = dict(ref.named_parameters())
    grad_diff = max((p.grad - ref_params[name].grad).abs().max().item()
                    for name, p in submodule.named_parameters())
    mine: dict[str, Any] = {"rank": rank, "grad_diff": grad_diff,
                            "params": sorted(n for n, _ in submodule.named_parameters())}
    if last:
        mine["losses"] = [loss.detach().item() for loss in losses]
        mine["loss_dtype"] = str(losses[0].dtype) if losses else ""
        with torch.no_grad():
            mine["out_diff"] = (out.detach() - ref(x)).abs().max().item()
    return mine


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """ScheduleGPipe and Schedule1F1B against per-micro-batch single-process references.

    Writes nothing under ``work_dir``.
    """
    del work_dir
    world = ctx.world_size
    n_micro = 2 * world
    gen = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(n_micro * ROWS_PER_MICROBATCH, WIDTH, generator=gen, dtype=DTYPE)
    y = torch.randn(n_micro * ROWS_PER_MICROBATCH, WIDTH, generator=gen, dtype=DTYPE)
    x, y = x.to(ctx.device), y.to(ctx.device)

    ref = build(world).to(ctx.device)
    ref_losses = [F.mse_loss(ref(xm), ym) for xm, ym in zip(x.chunk(n_micro),
                                                             y.chunk(n_micro), strict=True)]
    torch.stack(ref_losses).mean().backward()
    ref_values = [loss.item() for loss in ref_losses]

    checks: list[dict[str, object]] = []
    for label, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        mine = _run_schedule(ctx, cls, x, y, n_micro, ref)
        every: list[Any] = [None] * world
        dist.all_gather_object(every, mine)
        tail = every[-1]
        losses = tail["losses"]
        count_ok = len(losses) == n_micro
        loss_diff = (max(abs(a - b) for a, b in zip(losses, ref_values, strict=True))
                     if count_ok else float("inf"))
        grad_diff = max(m["grad_diff"] for m in every)
        owned = "; ".join(f"stage {m['rank']}: {', '.join(m['params'])}" for m in every)
        shown = ", ".join(f"{v:.6f}" for v in losses)
        checks += [
            check(f"{label}_microbatch_loss_max_abs_diff", loss_diff, TOLERANCE,
                  f"float64; {len(losses)} losses from step(losses=[]) on stage {world - 1} "
                  f"(expected {n_micro}, dtype {tail['loss_dtype']}): [{shown}]",
                  passed=count_ok and loss_diff <= TOLERANCE),
            check(f"{label}_last_stage_output_max_abs_diff", tail["out_diff"], TOLERANCE,
                  "float64; step()'s merged output vs the reference forward"),
            check(f"{label}_stage_grad_max_abs_diff", grad_diff, TOLERANCE,
                  "float64, worst stage, vs grad of the mean of per-micro-batch reference "
                  f"losses (scale_grads=True); {owned}; per stage "
                  + ", ".join(f"{m['grad_diff']:.1e}" for m in every)),
        ]
    return checks
