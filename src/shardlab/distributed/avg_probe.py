"""Does ``reduce_scatter_tensor`` honour ``ReduceOp.AVG`` on this backend? Detect, never assume.

FSDP2 (:func:`torch.distributed.fsdp.fully_shard`) reduce-scatters fp32 and bf16 gradients
with ``ReduceOp.AVG`` by default (``_get_gradient_divide_factors`` in
``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``). In torch 2.8 gloo's
``reduce_scatter_tensor`` ignored the op it was given and summed, so every FSDP2 gradient
came out ``world`` times too large; torch 2.13 is said to honour AVG. Which one holds is
measured on the job's own process group by :func:`probe_avg_ratio`, the ratio of the
output of one AVG reduce-scatter of known values to their true average:

* ratio 1: AVG honoured; FSDP2's default path is right and needs nothing;
* ratio ``world``: AVG silently summed; the fix is
  :meth:`torch.distributed.fsdp.FSDPModule.set_force_sum_reduction_for_comms` ``(True)`` on
  every FSDP module, which makes FSDP2 reduce with ``ReduceOp.SUM`` and divide by the
  world size itself (a post-divide);
* anything else: an unknown behaviour, refused.

:func:`needs_force_sum` turns the ratio into that decision; FSDP2 in training
(:mod:`shardlab.distributed.data_parallel`) and the ``verify`` experiments apply the
workaround only when it says so (on a backend that honours AVG, forcing SUM would also be
correct but would hide the fact that the workaround is no longer needed).
:mod:`shardlab.verify.gloo_avg` checks that FSDP2 behaves as the probe predicts.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from shardlab.distributed.launch import RankContext

RATIO_TOL = 1e-6  # the probe's values are small integers: exact in fp32 either way
PROBE_WIDTH = 4  # elements of the reduce-scatter output on each rank


def _probe_input(rank: int, world: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s reduce-scatter input: element j is ``(rank + 1) * (j + 1)``."""
    j = torch.arange(world * PROBE_WIDTH, dtype=torch.float32, device=device)
    return (rank + 1) * (j + 1)


def probe_avg_ratio(ctx: RankContext) -> float:
    """Measured / expected output of ``dist.reduce_scatter_tensor(..., op=ReduceOp.AVG)``.

    Every rank contributes ``(rank + 1) * (j + 1)`` at position j, so the true average at
    position j is ``(j + 1) * (world + 1) / 2`` (exact in fp32). Returns the common ratio
    of this rank's output chunk to that average: 1.0 when AVG is honoured, ``world`` when
    the backend summed instead, NaN when the elements disagree (neither: a broken reduce).
    A collective: every rank must call it.
    """
    device = torch.device(ctx.device)
    world = ctx.world_size
    out = torch.empty(PROBE_WIDTH, dtype=torch.float32, device=device)
    dist.reduce_scatter_tensor(out, _probe_input(ctx.rank, world, device), op=dist.ReduceOp.AVG)
    j = torch.arange(ctx.rank * PROBE_WIDTH, (ctx.rank + 1) * PROBE_WIDTH,
                     dtype=torch.float64, device=device)
    ratios = out.double() / ((j + 1) * (world + 1) / 2)
    if float(ratios.max() - ratios.min()) > RATIO_TOL:
        return math.nan
    return float(ratios.mean())


def classify_ratio(ratio: float, world_size: int) -> str | None:
    """``"honoured"`` (ratio 1), ``"summed"`` (ratio = world) or None (neither, or NaN).

    At world size 1 both readings give 1; that counts as honoured (FSDP2 then uses SUM
    anyway, see ``_get_gradient_divide_factors``).
    """
    if abs(ratio - 1.0) <= RATIO_TOL:
        return "honoured"
    if abs(ratio - world_size) <= RATIO_TOL * world_size:
        return "summed"
    return None


def needs_force_sum(ratio: float, world_size: int) -> bool:
    """Whether FSDP2 needs ``set_force_sum_reduction_for_comms(True)`` on this backend.

    True only when the probe saw AVG summed (ratio = world); False when AVG is honoured.
    Raises ValueError for any other ratio: no known workaround fits an unknown behaviour.
    """
    kind = classify_ratio(ratio, world_size)
    if kind is None:
        raise ValueError(f"reduce_scatter_tensor(AVG) gave ratio {ratio!r} at world size "
                         f"{world_size}: neither honoured (1) nor summed ({world_size})")
    return kind == "summed"
