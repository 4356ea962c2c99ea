"""Dry-run several roles side by side, each in a fresh process.

A role runs in its own spawned process (``max_tasks_per_child=1``): torch's fake process
group and the caches DTensor keeps per process group (sharding propagation, meshes)
belong to one world, and a second ``init_process_group`` in the same process finds
stale group names in them. A fresh process also keeps the caller free of torch and of a
process group (the command line, a test), and lets roles run on every core at once.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from shardlab.dryrun.role import run_role
from shardlab.train.config import TrainConfig


class RoleError(RuntimeError):
    """A role's dry run failed; the message names its rank and the error."""


def _one(cfg: TrainConfig, rank: int) -> dict[str, Any]:
    # torch's warnings about the program (FSDP's view outputs, the fake group) are the
    # same in the real run; the dry run reports figures, not them.
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        return run_role(cfg, rank)
    except Exception as e:  # any failure is reported with its rank
        first = str(e).strip().splitlines()
        raise RoleError(f"rank {rank}: {type(e).__name__}: {first[0] if first else ''}") \
            from None


def default_jobs(roles: int) -> int:
    """Processes at once: one per core, at most one per role."""
    return max(1, min(roles, os.cpu_count() or 1))


def run_roles(cfg: TrainConfig, ranks: list[int], jobs: int | None = None
              ) -> list[dict[str, Any]]:
    """Every rank's :func:`shardlab.dryrun.role.run_role` result, in ``ranks``' order,
    ``jobs`` processes at a time (default :func:`default_jobs`). The first failure
    raises :class:`RoleError` (the roles not yet started are cancelled)."""
    return run_many([(cfg, r) for r in ranks], jobs)


def run_many(work: list[tuple[TrainConfig, int]], jobs: int | None = None
             ) -> list[dict[str, Any]]:
    """:func:`run_roles` for roles of several jobs at once, as ``(config, rank)`` pairs."""
    jobs = jobs or default_jobs(len(work))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context,
                             max_tasks_per_child=1) as pool:
        futures = [pool.submit(_one, cfg, r) for cfg, r in work]
        try:
            return [f.result() for f in futures]
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
