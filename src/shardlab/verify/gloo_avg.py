"""FSDP2's gradient scale on this backend, as the ``ReduceOp.AVG`` probe predicts it.

The probe (:mod:`shardlab.distributed.avg_probe`) measures whether gloo's (or NCCL's)
``reduce_scatter_tensor`` honours ``ReduceOp.AVG`` (ratio 1) or silently sums (ratio
``world``, as torch 2.8's gloo did), and :func:`~shardlab.distributed.avg_probe.needs_force_sum`
decides on FSDP2's ``set_force_sum_reduction_for_comms(True)`` workaround from it;
:mod:`shardlab.verify.fsdp2` and :mod:`shardlab.verify.checkpoint` apply the workaround
only when it says so.

``run`` checks that the ratio is one of the two known values on every rank, then takes one
gradient through a one-layer FSDP2 module twice: on FSDP2's default path (its scale must
equal the probe's ratio: the probe predicts what FSDP2 does) and with force-sum (its scale
must be 1: the workaround itself is sound here). The policy "force-sum only when the probe
says AVG is summed" must then give exactly the ranks' average gradient (scale 1).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from shardlab.distributed.avg_probe import (
    RATIO_TOL,
    classify_ratio,
    needs_force_sum,
    probe_avg_ratio,
)
from shardlab.distributed.launch import RankContext
from shardlab.verify.registry import check


def _gather_floats(value: float, ctx: RankContext) -> list[float]:
    """Every rank's ``value`` (float64 all-gather), by rank."""
    device = torch.device(ctx.device)
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    every = torch.empty(ctx.world_size, dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(every, mine)
    return every.tolist()


def fsdp_grad_ratio(ctx: RankContext, force_sum: bool) -> float:
    """Gradient scale of a one-layer FSDP2 module relative to the true data-parallel mean.

    Each rank feeds its own input to ``fully_shard(nn.Linear(8, 8))``; FSDP2's intended
    gradient is the average over ranks of the local gradients, which every rank can
    compute itself from the same seeded inputs. Returns the least-squares scale
    ``<g, e> / <e, e>`` of the gathered gradient ``g`` (``DTensor.full_tensor()``) against
    that average ``e``, or NaN when ``g`` is not a multiple of ``e``. A collective.
    """
    device = torch.device(ctx.device)
    gen = torch.Generator().manual_seed(1234)
    weight = torch.randn(8, 8, generator=gen, dtype=torch.float64)
    inputs = torch.randn(ctx.world_size, 3, 8, generator=gen, dtype=torch.float64)

    def layer() -> nn.Linear:
        lin = nn.Linear(8, 8, bias=False, device=device)
        with torch.no_grad():
            lin.weight.copy_(weight)
        return lin

    expected = torch.zeros(8, 8, dtype=torch.float64)
    for r in range(ctx.world_size):  # the reference: each rank's local gradient, averaged
        ref = layer()
        ref(inputs[r].float().to(device)).square().sum().backward()
        expected += ref.weight.grad.double().cpu() / ctx.world_size

    mesh = init_device_mesh(device.type, (ctx.world_size,))
    model = fully_shard(layer(), mesh=mesh)
    if force_sum:
        model.set_force_sum_reduction_for_comms(True)
    model(inputs[ctx.rank].float().to(device)).square().sum().backward()
    got = model.weight.grad.full_tensor().double().cpu()
    scale = float((got * expected).sum() / (expected * expected).sum())
    residual = float((got - scale * expected).abs().max() / expected.abs().max())
    return scale if residual <= 1e-5 else math.nan


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """Probe AVG, then show that FSDP2 behaves as the probe predicts, with and without the
    workaround. Writes nothing (``work_dir`` unused)."""
    world = ctx.world_size
    ratios = _gather_floats(probe_avg_ratio(ctx), ctx)
    ratio = ratios[ctx.rank]
    kinds = {classify_ratio(r, world) for r in ratios}
    kind = classify_ratio(ratio, world)
    distance = max((min(abs(r - 1.0), abs(r - world)) if not math.isnan(r) else math.inf)
                   for r in ratios)
    checks = [
        check("avg_ratio_is_known", distance, RATIO_TOL,
              detail=f"reduce_scatter_tensor(ReduceOp.AVG) on {ctx.backend}, torch "
                     f"{torch.__version__}, world {world}: ratio {ratio:.6f} = AVG {kind}"
                     if kind else f"ratio {ratio!r}: neither honoured (1) nor summed ({world})"),
        check("ranks_agree", 0.0 if len(kinds) == 1 else 1.0, 0.0,
              detail=f"ratios by rank: {ratios}"),
    ]
    if kind is None or len(kinds) != 1:
        return checks  # no decision can be made; the FSDP checks below would mislead

    force = needs_force_sum(ratio, world)
    default_scale = fsdp_grad_ratio(ctx, force_sum=False)
    forced_scale = fsdp_grad_ratio(ctx, force_sum=True)
    policy_scale = forced_scale if force else default_scale

    def off_by(scale: float, target: float) -> float:
        return abs(scale - target) / target if not math.isnan(scale) else math.inf

    checks += [
        check("fsdp_default_path_matches_probe", off_by(default_scale, ratio), 1e-5,
              detail=f"FSDP2's default (AVG) gradient is {default_scale:.6f} x the rank "
                     f"average; the probe predicted {ratio:.6f}"),
        check("force_sum_path_correct", off_by(forced_scale, 1.0), 1e-5,
              detail=f"with set_force_sum_reduction_for_comms(True) (SUM, then FSDP2 divides "
                     f"by {world}) the gradient is {forced_scale:.6f} x the rank average"),
        check("workaround_applied_only_when_needed", off_by(policy_scale, 1.0), 1e-5,
              detail=("force-sum applied: the probe saw AVG summed" if force else
                       "force-sum not applied: the probe saw AVG honoured")
                     + f"; gradient scale under that policy {policy_scale:.6f}"),
    ]
    return checks
