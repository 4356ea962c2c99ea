"""Dry-run several roles side by side, each in a fresh process forked from a warm server.

A role runs in its own process (``max_tasks_per_child=1``): torch's fake process group
and the caches DTensor keeps per process group (sharding propagation, meshes) belong to
one world, and a second ``init_process_group`` in the same process finds stale group
names in them. The processes are forked from the fork server the launcher's ranks come
from (:mod:`shardlab.distributed.forkserver`), which imports torch and shardlab's rank
modules once, so a role no longer pays a fresh interpreter's torch import (2.4 s for
those imports on the 2-core build machine): a whole 4-role ``shardlab dryrun`` of the
default model took 0.355x the wall time of spawned roles there
(``benchmarks/rank_startup.py --pairs dryrun``, docs/guide/dryrun.md).

This module imports no torch: the role's code is named by :data:`ROLE`, a
``"module:function"`` string resolved in the role's process (as the launcher names a
rank's target), so the caller (``shardlab dryrun``, ``plan --dry-run-top``, a test) stays
free of torch and of a process group, and its own start-up overlaps the server's imports.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import warnings
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from shardlab.distributed import forkserver
from shardlab.train.config import TrainConfig

ROLE = "shardlab.dryrun.role:run_role"
"""What each role's process runs, ``f(cfg, rank) -> dict``, as ``"module:function"``."""

START_METHOD = forkserver.START_METHOD
"""multiprocessing's start method for the roles' processes (the benchmark's "spawn" side
sets it back to ``"spawn"``, what the pool used before)."""


class RoleError(RuntimeError):
    """A role's dry run failed; the message names its rank and the error."""


def _one(target: str, cfg: TrainConfig, rank: int) -> Any:
    # A fork of the server ignores SIGINT (forkserver.start); a role is put back to
    # Python's handler, so that Ctrl-C stops it at once, as it stopped a spawned role,
    # rather than the caller's pool waiting for it to finish.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # torch's warnings about the program (FSDP's view outputs, the fake group) are the
    # same in the real run; the dry run reports figures, not them.
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)(cfg, rank)
    except Exception as e:  # any failure is reported with its rank
        first = str(e).strip().splitlines()
        raise RoleError(f"rank {rank}: {type(e).__name__}: {first[0] if first else ''}") \
            from None


def _wait_warm(context: multiprocessing.context.BaseContext) -> None:
    """Return once the fork server has imported its preload: one fork of a process that
    does nothing, waited for. Why before the pool: a pool's worker carries the pool's
    queues, whose named semaphores go with this process; a Ctrl-C while the server still
    imports torch (2-3 s) would leave it to fork that worker after this process has gone,
    and the worker would print a traceback over the shell's prompt. This process has no
    semaphore and runs ``int()``, so it ends quietly whenever it comes."""
    probe = context.Process(target=int, name="shardlab-dryrun-probe")
    probe.start()
    probe.join()


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
    context = multiprocessing.get_context(START_METHOD)
    if START_METHOD == forkserver.START_METHOD:
        # Nothing when this process's server runs already (a launch started it).
        forkserver.start()
        _wait_warm(context)
    target = ROLE  # read once: every role of the call runs the same code
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context,
                             max_tasks_per_child=1) as pool:
        futures = [pool.submit(_one, target, cfg, r) for cfg, r in work]
        try:
            return [f.result() for f in futures]
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
