"""The algebra under tensor parallelism, on real tensors and real collectives.

For ``Y = X W`` (X [m, k], W [k, n]) split over ``world`` ranks:

* column split (Megatron's column-parallel linear): rank r holds ``W[:, cols_r]`` and the
  whole X, and computes ``X W[:, cols_r]``, which *is* the block of columns ``cols_r`` of Y
  (each output column needs only its own column of W). An all-gather then assembles Y by
  concatenating along the columns. All-gather concatenates along dim 0, so the gathered
  ``[world * m, n / world]`` rows are regrouped as ``[world, m, n / world]`` and permuted
  to put the rank blocks side by side: the layout step a gather of column shards needs;
* row split (row-parallel linear): rank r holds ``W[rows_r, :]`` and ``X[:, rows_r]`` and
  computes ``X[:, rows_r] W[rows_r, :]``, a full-size [m, n] *partial sum*: every entry
  of Y is a sum over k, and each rank has summed only its part of k. An all-reduce with
  SUM adds the parts; concatenation would be wrong here.

X and W are drawn in float64 from a seeded private generator, identical on every rank
(no broadcast needed). Checks: ``column_split_gather_concatenates`` and
``row_split_all_reduce_sums``, each the max |result - X W| (tolerance 1e-12: only the
order of float64 additions differs). Collectives, same order on every rank: one
all-gather, one all-reduce. Writes nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardlab.distributed.launch import RankContext
from shardlab.verify.registry import check

SEED = 2027
M, K_PER_RANK, N_PER_RANK = 3, 4, 3  # X [M, K], W [K, N] with K, N multiples of world
TOL = 1e-12


def operands(world: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """X [M, K_PER_RANK * world] and W [K, N_PER_RANK * world], float64, seeded."""
    gen = torch.Generator().manual_seed(SEED)
    k, n = K_PER_RANK * world, N_PER_RANK * world
    x = torch.randn(M, k, generator=gen, dtype=torch.float64)
    w = torch.randn(k, n, generator=gen, dtype=torch.float64)
    return x.to(device), w.to(device)


def column_parallel(x: torch.Tensor, w: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """``X W`` from each rank's column block of W, all-gathered (a collective)."""
    local = x @ w.chunk(world, dim=1)[rank]  # [m, n / world]: Y's columns of this rank
    flat = torch.empty(world * local.numel(), dtype=local.dtype, device=local.device)
    dist.all_gather_single(flat, local.reshape(-1))  # rank blocks one after another
    m, n_local = local.shape
    return flat.view(world, m, n_local).permute(1, 0, 2).reshape(m, world * n_local)


def row_parallel(x: torch.Tensor, w: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """``X W`` from each rank's slice of the inner dimension, all-reduced (a collective)."""
    partial = x.chunk(world, dim=1)[rank] @ w.chunk(world, dim=0)[rank]  # [m, n], partial
    dist.all_reduce(partial, op=dist.ReduceOp.SUM)
    return partial


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """Column split then row split of one product, each against the unsplit ``X W``."""
    world, rank = ctx.world_size, ctx.rank
    x, w = operands(world, torch.device(ctx.device))
    full = x @ w
    col = column_parallel(x, w, rank, world)
    row = row_parallel(x, w, rank, world)
    shapes = f"X {tuple(x.shape)}, W {tuple(w.shape)}, {world} ranks, float64"
    return [
        check("column_split_gather_concatenates", float((col - full).abs().max()), TOL,
              detail=f"each rank X W[:, cols_r] [{M}, {N_PER_RANK}], all-gathered and "
                     f"concatenated along columns vs X W; {shapes}"),
        check("row_split_all_reduce_sums", float((row - full).abs().max()), TOL,
              detail=f"each rank X[:, rows_r] W[rows_r, :] [{M}, {N_PER_RANK * world}] (a "
                     f"partial sum), all-reduced with SUM vs X W; {shapes}"),
    ]
