"""``shardlab verify``: real processes check that PyTorch's sharding does what it claims."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardlab.cli.args import positive_float, positive_int
from shardlab.cli.guard import check_memory
from shardlab.cli.output import print_json
from shardlab.config.layout import make_layout
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.estimate.memory import stage_memory
from shardlab.report.tables import show, table
from shardlab.verify.registry import EXPERIMENTS, GLOBAL_BATCH


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
    p.add_argument("--allow-oversubscribe", action="store_true",
                   help="start even when the ranks' expected memory exceeds what this host "
                   "has free")
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


RANK_RUNTIME_BYTES = 320 * 2**20
"""Peak resident memory of one verify rank running all ten experiments: 310 MiB measured at
world size 2 with gloo (torch 2.x on Linux); the launching process peaked at 265 MiB."""


def model_peak_bytes(shape: ModelShape, global_batch: int) -> float:
    """The cost model's states and activations of ``shape`` on the whole global batch in
    one float64 micro-batch (bytes): every rank also computes the one-process reference on
    the whole batch, and some experiments run in float64."""
    lay = make_layout(shape, micro_batch=global_batch, global_batch=global_batch, dtype="fp64")
    return stage_memory(shape, lay, dropout=False)[0].total


def largest_shapes() -> tuple[ModelShape, ...]:
    """The experiments' largest transformers: ``activation_checkpointing``'s (4 layers,
    context 64) and ``ddp_token_weighting``'s. ``fsdp2``'s (2 layers, context 32) and
    ``tensor_parallel``'s (1 layer, context 8) are smaller (the tests check); their
    modules load torch's FSDP and tensor-parallel packages, seconds a refusal must not wait."""
    # Imported here: they load torch, which the torch-free commands (budget, plan) must not.
    from shardlab.verify import checkpointing, ddp

    return ddp.SHAPE, checkpointing.SHAPE


def rank_peak_bytes(global_batch: int) -> float:
    """Bytes one verify rank may hold at its peak, at any world size: the interpreter with
    torch and a process group (:data:`RANK_RUNTIME_BYTES`) and the largest experiment
    model's :func:`model_peak_bytes`. The models are tiny: the interpreter dominates."""
    return RANK_RUNTIME_BYTES + max(model_peak_bytes(s, global_batch) for s in largest_shapes())


def check_host(host: str) -> None:
    """``--host`` must be an IPv4 name or address of this machine: the rendezvous listens
    there. Binding it as the launcher will (``free_port``: AF_INET, port 0) is the test."""
    allowed = ("must be an IPv4 name or address of this machine, where the rendezvous "
               "listens (--host; default 127.0.0.1)")
    if not host.strip():
        raise SpecError("host", host, allowed)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
    except (OSError, UnicodeError) as e:  # gaierror is an OSError; IDNA refuses long labels
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SpecError("host", host, f"{allowed}: {why}") from None


def prepare_log_dir(log_dir: str | None) -> None:
    """Make ``--log-dir`` (as the launcher would) and check that files can be made in it;
    a path that is a file, or a place this process cannot write, is a SpecError. Called
    after every other check, so a refused command leaves nothing behind."""
    if log_dir is None:
        return
    allowed = "must be a folder this process can write (--log-dir; created if missing)"
    if not log_dir.strip():
        raise SpecError("log_dir", log_dir, allowed)
    path = Path(log_dir)
    try:
        if path.exists() and not path.is_dir():
            raise SpecError("log_dir", log_dir, f"{allowed}: it is a file")
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=path).cleanup()  # can the launcher make its folders?
    except OSError as e:  # read-only, under a file, a name too long, no permission
        raise SpecError("log_dir", log_dir, f"{allowed}: {e.strerror or e}") from None


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
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # launch.under_torchrun
    names = selected(args.only)
    world = int(os.environ["WORLD_SIZE"]) if torchrun else args.world_size
    if world < 2:
        raise SpecError("world_size", world, "must be >= 2 (these experiments shard)")
    if GLOBAL_BATCH % world:
        raise SpecError("world_size", world, f"must divide the global batch ({GLOBAL_BATCH})")
    if not torchrun:  # under torchrun the processes exist, the rendezvous is its own
        check_host(args.host)
        # The ranks and the launching process, which holds torch as well.
        check_memory(rank_peak_bytes(GLOBAL_BATCH), world + 1,
                     f"shardlab verify at world size {world}", args.allow_oversubscribe)
        prepare_log_dir(args.log_dir)
        # Imported here: multiprocessing's fork server, which no other command starts.
        from shardlab.distributed import forkserver

        # Started once every check passed and before this process imports torch, as train
        # does: the server's imports run beside this process's own, the ranks fork warm.
        forkserver.start()
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.distributed.launch import LaunchError, Terminated, signals_stop
    from shardlab.verify.runner import verify

    start = time.perf_counter()
    try:
        # SIGTERM, SIGHUP and SIGQUIT stop the ranks and raise here, so the shared folder
        # is still removed on the way out (SIGINT: KeyboardInterrupt, exit 130 in main).
        with signals_stop(), _work_dir() as work:
            checks = verify(names, world, work, timeout_s=args.timeout, host=args.host,
                            log_dir=args.log_dir, fault_rank=args.inject_fault)
    except LaunchError as e:
        sys.stderr.write(f"shardlab verify: {e}\n")
        return 1
    except Terminated as e:
        sys.stderr.write(f"shardlab verify: {e}; every rank stopped\n")
        return 128 + e.signum
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
