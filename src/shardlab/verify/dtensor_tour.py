"""A tour of ``DTensor.redistribute``: exact values, and the one collective each step uses.

On a 1-D mesh of every rank (``init_device_mesh``) a known global tensor
``G = arange(2w · 4w).reshape(2w, 4w)`` (float64, w = world size; 4x8 on two ranks)
goes through the placements of ``torch.distributed.tensor``:

1. ``distribute_tensor(G, mesh, [Shard(0)])``: rank r holds rows chunk r.
2. ``Shard(0) -> Replicate()``: every rank holds G.
3. ``Partial() -> Replicate()``: a ``Partial`` ("sum") DTensor built with
   ``DTensor.from_local`` from a different integer-valued addend on each rank (their
   sum is G) becomes G on every rank.
4. ``Partial() -> Shard(0)``: the same sum, but each rank keeps only its row chunk.
5. ``Shard(0) -> Shard(1)``: rows chunk r becomes columns chunk r.
6. ``full_tensor()`` of the ``Shard(1)`` DTensor gives G back.

Every value is an integer far below 2**53, so each step must reproduce the expected
slice of G (``torch.chunk`` of G, as DTensor shards) exactly: value = max abs
difference, tolerance 0.

``torch.distributed.tensor.debug.CommDebugMode`` counts the collectives each step runs
(the ``detail`` lists them), and the checks require exactly what torch 2.13 does,
measured and read in its source: ``distribute_tensor`` one ``scatter_`` (from rank 0),
``Shard -> Replicate`` one ``all_gather_into_tensor``, ``Partial -> Replicate`` one
``all_reduce``, ``Partial -> Shard`` one ``reduce_scatter_tensor``, ``full_tensor()``
one ``all_gather_into_tensor``. ``Shard(0) -> Shard(1)`` is an all-to-all in principle,
and on CUDA torch runs its own ``_dtensor.shard_dim_alltoall``; on a CPU mesh
``shard_dim_alltoall`` in ``torch/distributed/tensor/_collective_utils.py`` falls back
("Gloo does not support alltoall") to one ``all_gather_into_tensor`` followed by a
local chunk, which moves world times the data an all-to-all would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from shardlab.distributed.launch import RankContext
from shardlab.verify.registry import check

DTYPE = torch.float64


def expected_comms(device_type: str) -> dict[str, dict[str, int]]:
    """The collectives CommDebugMode sees for each step in torch 2.13, by device type."""
    shard_to_shard = ({"all_gather_into_tensor": 1} if device_type == "cpu"
                      else {"shard_dim_alltoall": 1})
    return {
        "distribute_shard0": {"scatter_": 1},
        "shard0_to_replicate": {"all_gather_into_tensor": 1},
        "partial_to_replicate": {"all_reduce": 1},
        "partial_to_shard0": {"reduce_scatter_tensor": 1},
        "shard0_to_shard1": shard_to_shard,
        "full_tensor": {"all_gather_into_tensor": 1},
    }


def addend(global_: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s integer-valued part of ``global_``; the parts over ranks sum to it.

    ``floor(G / w)`` on every rank, plus ``G mod w`` on rank 0, plus ``2r - (w - 1)``
    (which sums to zero over ranks) so that no two ranks hold the same part.
    """
    part = torch.div(global_, world, rounding_mode="floor") + (2 * rank - (world - 1))
    if rank == 0:
        part = part + torch.remainder(global_, world)
    return part


def _measured(step: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """Run ``step`` under CommDebugMode; its result and the collectives by short name."""
    mode = CommDebugMode()
    with mode:
        result = step()
    return result, {str(op).split(".")[-1]: int(n) for op, n in mode.get_comm_counts().items()}


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """Redistribute a known tensor through Shard, Replicate and Partial; check values and comms.

    Writes nothing under ``work_dir``.
    """
    del work_dir
    rank, world = ctx.rank, ctx.world_size
    device_type = torch.device(ctx.device).type
    mesh = init_device_mesh(device_type, (world,))
    g = torch.arange(2 * world * 4 * world, dtype=DTYPE, device=ctx.device)
    g = g.reshape(2 * world, 4 * world)
    rows, cols = g.chunk(world, dim=0)[rank], g.chunk(world, dim=1)[rank]

    parts = [addend(g, r, world) for r in range(world)]
    parts_ok = torch.equal(torch.stack(parts).sum(0), g)

    results: dict[str, tuple[torch.Tensor, torch.Tensor, dict[str, int]]] = {}
    shard0, comms = _measured(lambda: distribute_tensor(g, mesh, [Shard(0)]))
    results["distribute_shard0"] = (shard0.to_local(), rows, comms)
    out, comms = _measured(lambda: shard0.redistribute(mesh, [Replicate()]))
    results["shard0_to_replicate"] = (out.to_local(), g, comms)
    partial = DTensor.from_local(parts[rank], mesh, [Partial()])
    out, comms = _measured(lambda: partial.redistribute(mesh, [Replicate()]))
    results["partial_to_replicate"] = (out.to_local(), g, comms)
    out, comms = _measured(lambda: partial.redistribute(mesh, [Shard(0)]))
    results["partial_to_shard0"] = (out.to_local(), rows, comms)
    shard1, comms = _measured(lambda: shard0.redistribute(mesh, [Shard(1)]))
    results["shard0_to_shard1"] = (shard1.to_local(), cols, comms)
    full, comms = _measured(lambda: shard1.full_tensor())
    results["full_tensor"] = (full, g, comms)

    names = list(results)
    local = [(got - want).abs().max().item() if got.shape == want.shape else float("inf")
             for got, want, _ in results.values()]
    worst = torch.tensor(local, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # every rank's shard, worst reported
    every: list[Any] = [None] * world
    dist.all_gather_object(every, {n: results[n][2] for n in names})
    expected = expected_comms(device_type)

    checks = [check("partial_addends_sum_to_global", 0.0 if parts_ok else 1.0, 0.0,
                    f"rank {rank}'s addend differs from G: {not torch.equal(parts[rank], g)}")]
    for i, name in enumerate(names):
        got, want, _ = results[name]
        checks.append(check(f"{name}_max_abs_diff", worst[i].item(), 0.0,
                            f"local shape {tuple(got.shape)} vs expected {tuple(want.shape)}"
                            f" (global {tuple(g.shape)}, world {world}), float64, worst rank"))
    for name in names:
        seen = [c[name] for c in every]
        same = all(s == expected[name] for s in seen)
        checks.append(check(f"{name}_collectives", 0.0 if same else 1.0, 0.0,
                            f"CommDebugMode on rank 0: {seen[0]}; expected {expected[name]} "
                            f"({device_type}); all ranks agree: {all(s == seen[0] for s in seen)}"))

    if mesh.get_group() is not dist.group.WORLD:  # a 1-D world mesh reuses the default group
        dist.destroy_process_group(mesh.get_group())
    return checks
