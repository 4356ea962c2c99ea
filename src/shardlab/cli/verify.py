"""``shardlab verify``: real processes check that PyTorch's sharding does what it claims."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardlab.cli.args import positive_float, positive_int
from shardlab.cli.output import print_json
from shardlab.errors import SpecError
from shardlab.report.tables import show, table
from shardlab.verify.registry import EXPERIMENTS


def register(sub: Any) -> None:
    """Add the ``verify`` sub-command."""
    p = sub.add_parser("verify", help="real gloo/NCCL processes check PyTorch's sharding",
                       description="Start N real processes through torch's elastic launcher "
                       "and run the experiments: " + ", ".join(EXPERIMENTS) + ".")
    p.add_argument("--world-size", type=positive_int, default=2,
                   help="ranks (2, 4 or 8: they split a global batch of 8 sequences)")
    p.add_argument("--only", help="comma-separated experiment names (default: all)")
    p.add_argument("--timeout", type=positive_float, default=60.0,
                   help="seconds any collective may wait (bounds how long a dead rank can "
                   "hold the job)")
    p.add_argument("--host", default="127.0.0.1", help="rendezvous host (loopback by default)")
    p.add_argument("--log-dir", help="per-rank logs go here (default: a new temporary folder)")
    p.add_argument("--inject-fault", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def selected(only: str | None) -> list[str]:
    """The experiment names to run, in the registry's order; SpecError for unknown ones."""
    if only is None:
        return list(EXPERIMENTS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown or not names:
        raise SpecError("only", only, f"unknown experiment {', '.join(unknown) or '(none)'}; "
                        f"choose from {', '.join(EXPERIMENTS)}")
    return [n for n in EXPERIMENTS if n in names]


@contextlib.contextmanager
def _work_dir() -> Iterator[str]:
    """A folder every rank shares (distributed checkpoints are written there). Under
    torchrun each rank runs this command itself, so the name comes from the job's run id
    (on several nodes it must be on a shared file system)."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.distributed.launch import under_torchrun

    if not under_torchrun():
        with tempfile.TemporaryDirectory(prefix="shardlab-verify-") as work:
            yield work
        return

    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "torchrun")
    work = Path(tempfile.gettempdir(), f"shardlab-verify-{run_id}")
    work.mkdir(exist_ok=True)
    yield str(work)
    if os.environ.get("RANK") == "0":  # every rank is done: results were gathered to rank 0
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    """Validate, launch, print one row per check; exit 1 when any check fails."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.distributed.launch import LaunchError, under_torchrun
    from shardlab.verify.runner import GLOBAL_BATCH, verify

    names = selected(args.only)
    world = args.world_size
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
    if world < 2:
        raise SpecError("world_size", world, "must be >= 2 (these experiments shard)")
    if GLOBAL_BATCH % world:
        raise SpecError("world_size", world, f"must divide the global batch ({GLOBAL_BATCH})")
    start = time.perf_counter()
    with _work_dir() as work:
        try:
            checks = verify(names, world, work, timeout_s=args.timeout, host=args.host,
                            log_dir=args.log_dir, fault_rank=args.inject_fault)
        except LaunchError as e:

            sys.stderr.write(f"shardlab verify: {e}\n")
            return 1
    if not checks:  # a non-zero rank under torchrun: rank 0 reports
        return 0
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    import torch

    from shardlab.distributed.launch import backend_for_this_machine

    doc = {"checks": checks, "world_size": world, "torch_version": torch.__version__,
           "backend": backend_for_this_machine(), "elapsed_s": time.perf_counter() - start,
           "passed": all(c["passed"] for c in checks)}
    if args.json:
        print_json(doc)
    else:
        show(table(f"shardlab verify: {world} ranks, {doc['backend']}, torch "
                   f"{doc['torch_version']}, {doc['elapsed_s']:.1f} s (what each measured: "
                   "--json)", ("check", "value", "tolerance", "result"),
                   [(c["name"], f"{c['value']:.3g}", f"{c['tolerance']:.3g}",
                     "[green]pass[/green]" if c["passed"] else "[red]FAIL[/red]")
                    for c in checks]))
        failed = sum(not c["passed"] for c in checks)
        show(f"{len(checks)} checks: " + ("[green]all pass[/green]" if not failed
                                          else f"[red]{failed} failed[/red]"))
    return 0 if doc["passed"] else 1
