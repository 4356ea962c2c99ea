"""Run the chosen experiments inside every rank, then their ``after`` parts in the caller."""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from shardlab.distributed.launch import RankContext, launch
from shardlab.verify.registry import EXPERIMENTS


def run_experiments(ctx: RankContext, names: list[str], work_dir: str,
                    fault_rank: int | None = None) -> dict[str, Any]:
    """Every rank: each experiment in order, its checks and seconds.

    ``fault_rank`` raises on that rank at the start of the second experiment (the first
    if only one), while the other ranks are entering its collectives: the test of what a
    dead rank does to a job.
    """
    out: dict[str, Any] = {}
    for i, name in enumerate(names):
        if fault_rank == ctx.rank and i == min(1, len(names) - 1):
            raise RuntimeError(f"fault injected on rank {ctx.rank} before {name}")
        folder = Path(work_dir, name)
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        checks = importlib.import_module(EXPERIMENTS[name][0]).run(ctx, str(folder))
        dist.barrier()  # the next experiment starts together on every rank
        out[name] = {"checks": checks, "seconds": time.perf_counter() - start}
    return out


def verify(names: list[str], world_size: int, work_dir: str, *, timeout_s: float = 60.0,
           host: str = "127.0.0.1", log_dir: str | None = None,
           fault_rank: int | None = None) -> list[dict[str, Any]]:
    """Launch the ranks, merge their checks (a check passes only if it passed on every
    rank; values and details are rank 0's), then run each experiment's ``after``."""
    per_rank = launch(f"{__name__}:run_experiments", world_size, (names, work_dir, fault_rank),
                      timeout_s=timeout_s, host=host, log_dir=log_dir)
    if not per_rank:  # a non-zero rank under torchrun: rank 0 reports
        return []
    checks: list[dict[str, Any]] = []
    for name in names:
        rank0 = per_rank[0][name]["checks"]
        for j, c in enumerate(rank0):
            everywhere = all(r[name]["checks"][j]["passed"] for r in per_rank)
            checks.append({**c, "name": f"{name}.{c['name']}", "passed": everywhere})
        module = importlib.import_module(EXPERIMENTS[name][0])
        if hasattr(module, "after"):
            checks += [{**c, "name": f"{name}.{c['name']}"}
                       for c in module.after(str(Path(work_dir, name)))]
    return checks
