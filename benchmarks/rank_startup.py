"""Rank start-up: ranks spawned (each a fresh interpreter importing torch, the launcher
and the dry-run pool before the fork server) against ranks forked from the warm fork
server, side by side.

Three pairs (``--pairs``, default all), each run ``--runs`` times (default 5), strictly
alternating (spawn, forkserver, spawn, ...) after one untimed warm-up of each, so that
machine noise (other jobs on the cores, the page cache) falls on both sides alike;
medians, so that one stray run does not decide a ratio:

* **train**: the wall time of a whole fresh ``shardlab train --dp 2 --steps 3 --json`` on
  the default model (2 ranks), from the process's start to its exit. "spawn" is the
  command with the launcher's start method put back to ``spawn`` and no early fork
  server (what the launcher did before); "forkserver" is the command as it is.
* **launches**: in one process, ``--launches`` (default 6) launches of a 2-rank job that
  does one all-reduce, timed each: the first (a fork server's start included) and the
  median of the others, what each later launch of a process that launches many jobs
  costs (the test suite launches dozens).
* **dryrun**: the wall time of a whole fresh ``shardlab dryrun`` of the default model with
  4 roles (``--gpus 4 --layout "pp=4 micro_batch=1" --all-roles``, 2 processes at a time
  on 2 cores). "spawn" is the pool of before: the command imports the role's module (and
  torch) itself and spawns each role; "forkserver" is the command as it is (torch-free,
  each role forked from the warm server).

The figure to reach: train's forkserver/spawn ratio at most 0.70 (at least 30% less wall
time). The command exits 1 when it is not reached, 2 when a run fails, else 0. It prints
the processor (``model name`` of /proc/cpuinfo), its core count and the load average
before and after, which say how far the figures can be trusted on a shared machine::

    .venv/bin/python benchmarks/rank_startup.py [--runs N] [--launches N]
                                                [--pairs train,launches,dryrun] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from shardlab.cli.args import positive_int

TARGET_RATIO = 0.70
METHODS = ("spawn", "forkserver")
TRAIN = ["train", "--dp", "2", "--steps", "3", "--json"]
DRYRUN = ["dryrun", "--gpus", "4", "--layout", "pp=4 micro_batch=1", "--global-batch", "4",
          "--all-roles", "--json"]
PAIRS = ("train", "launches", "dryrun")

# The launcher of before: spawned ranks, no fork server started early by the command.
_SPAWN_PATCH = ("import shardlab.distributed.forkserver as f; f.START_METHOD = 'spawn'; "
                "f.start = lambda: None; ")
# The dry-run pool of before: the caller imported run_role (torch) and spawned each role.
_DRYRUN_SPAWN_PATCH = ("import shardlab.dryrun.role; import shardlab.dryrun.pool as p; "
                       "p.START_METHOD = 'spawn'; ")
_TRAIN_CODE = ("import sys; {patch}from shardlab.cli import main; "
               "sys.exit(main(sys.argv[1:]))")
_LAUNCHES_CODE = ("import sys, time, json; sys.path.insert(0, {here!r}); {patch}"
                  "from shardlab.distributed.launch import launch; out = []\n"
                  "for _ in range({n}):\n"
                  "    t = time.perf_counter()\n"
                  "    launch('rank_startup:one_all_reduce', 2, log_dir={logs!r})\n"
                  "    out.append(time.perf_counter() - t)\n"
                  "print(json.dumps(out))")


def one_all_reduce(ctx: object) -> float:
    """What each rank of the launches pair does: one all-reduce (torch imported here, in a
    rank, so that this file's top stays torch-free)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t)


def processor() -> str:
    """The ``model name`` of /proc/cpuinfo, or the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform  # only where /proc/cpuinfo is missing

    return platform.processor() or "unknown"


def _run(code: str, args: list[str]) -> str:
    """``python -c code args``'s stdout; it has ended when this returns (its output goes to
    files, so the wait is for the process itself, not for helpers that share its pipes)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.run([sys.executable, "-c", code, *args], stdout=out, stderr=err,
                           text=True, check=False)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            tail = err.read().strip().splitlines()[-3:]
            raise RuntimeError(f"exited {p.returncode}: {' | '.join(tail)}")
        return out.read()


def train_once(method: str, log_root: str) -> float:
    """Seconds of wall time of one whole ``shardlab train`` process with ``method``."""
    code = _TRAIN_CODE.format(patch=_SPAWN_PATCH if method == "spawn" else "")
    log_dir = tempfile.mkdtemp(prefix=f"{method}-", dir=log_root)
    start = time.perf_counter()
    _run(code, [*TRAIN, "--log-dir", log_dir])
    return time.perf_counter() - start


def dryrun_once(method: str) -> float:
    """Seconds of wall time of one whole ``shardlab dryrun`` process with ``method``."""
    code = _TRAIN_CODE.format(patch=_DRYRUN_SPAWN_PATCH if method == "spawn" else "")
    start = time.perf_counter()
    _run(code, DRYRUN)
    return time.perf_counter() - start


def launches_once(method: str, n: int) -> list[float]:
    """Seconds of each of ``n`` launches, one after another in one fresh process."""
    with tempfile.TemporaryDirectory(prefix="rank-startup-launches-") as logs:
        code = _LAUNCHES_CODE.format(here=str(Path(__file__).resolve().parent), n=n,
                                     logs=logs, patch=_SPAWN_PATCH if method == "spawn" else "")
        return json.loads(_run(code, []).strip().splitlines()[-1])


def _alternate(once: Callable[[str], float], runs: int) -> dict[str, list[float]]:
    """``runs`` timed calls of ``once`` per method, alternating, after one untimed call of
    each (page cache, .pyc files)."""
    for m in METHODS:
        once(m)
    out: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(runs):
        for m in METHODS:
            out[m].append(once(m))
    return out


def measure(runs: int, launches: int, pairs: tuple[str, ...] = PAIRS) -> dict[str, object]:
    load_before = os.getloadavg()
    r: dict[str, object] = {"processor": processor(), "cores": os.cpu_count(), "runs": runs,
                            "pairs": list(pairs)}
    if "train" in pairs:
        with tempfile.TemporaryDirectory(prefix="rank-startup-") as root:
            train = _alternate(lambda m: train_once(m, root), runs)
        med = {m: statistics.median(train[m]) for m in METHODS}
        r |= {"train_s": train, "train_median_s": med,
              "train_ratio": med["forkserver"] / med["spawn"]}
    if "dryrun" in pairs:
        dry = _alternate(dryrun_once, runs)
        med = {m: statistics.median(dry[m]) for m in METHODS}
        r |= {"dryrun_s": dry, "dryrun_median_s": med,
              "dryrun_ratio": med["forkserver"] / med["spawn"]}
    if "launches" in pairs:
        first: dict[str, list[float]] = {m: [] for m in METHODS}
        later: dict[str, list[float]] = {m: [] for m in METHODS}
        for _ in range(max(1, runs // 2)):
            for m in METHODS:
                times = launches_once(m, launches)
                first[m].append(times[0])
                later[m] += times[1:]
        r |= {"launch_first_median_s": {m: statistics.median(first[m]) for m in METHODS},
              "launch_later_median_s": {m: statistics.median(later[m]) if later[m] else None
                                        for m in METHODS},
              "launches_per_process": launches}
    r |= {"load_before": [round(x, 2) for x in load_before],
          "load_after": [round(x, 2) for x in os.getloadavg()]}
    return r


def _print_pair(r: dict, key: str, argv: list[str]) -> None:
    print(f"shardlab {' '.join(argv)}, {r['runs']} runs each, alternating:")
    for m in METHODS:
        runs = " ".join(f"{x:.2f}" for x in r[f"{key}_s"][m])
        print(f"  {m:10s} median {r[f'{key}_median_s'][m]:6.2f} s  ({runs})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=positive_int, default=5,
                        help="timed runs of each start method per pair (default 5)")
    parser.add_argument("--launches", type=positive_int, default=6,
                        help="launches in one process, for the launches pair (default 6)")
    parser.add_argument("--pairs", default=",".join(PAIRS),
                        help=f"comma-separated pairs to run, of {', '.join(PAIRS)} (default all)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    pairs = tuple(x.strip() for x in args.pairs.split(",") if x.strip())
    bad = [x for x in pairs if x not in PAIRS]
    if bad or not pairs:
        sys.stderr.write(f"rank_startup: error: --pairs={args.pairs!r}: must be a comma-"
                         f"separated list of {', '.join(PAIRS)}\n")
        return 2
    try:
        r = measure(args.runs, args.launches, pairs)
    except RuntimeError as e:
        sys.stderr.write(f"rank_startup: error: {e}\n")
        return 2
    # Only train's ratio has a target; the exit code says whether it was reached when run.
    ok = "train" not in pairs or r["train_ratio"] <= TARGET_RATIO
    if args.json:
        print(json.dumps(r))
        return 0 if ok else 1
    print(f"processor: {r['processor']} ({r['cores']} cores); load average "
          f"{r['load_before']} before, {r['load_after']} after")
    if "train" in pairs:
        _print_pair(r, "train", TRAIN)
        print(f"  ratio forkserver/spawn {r['train_ratio']:.3f} (target <= {TARGET_RATIO}): "
              f"{'ok' if ok else 'NOT REACHED'}")
    if "dryrun" in pairs:
        _print_pair(r, "dryrun", DRYRUN)
        print(f"  ratio forkserver/spawn {r['dryrun_ratio']:.3f}")
    if "launches" in pairs:
        print(f"a 2-rank launch of one all-reduce, {r['launches_per_process']} in one "
              "process:")
        for m in METHODS:
            later = r["launch_later_median_s"][m]
            print(f"  {m:10s} first {r['launch_first_median_s'][m]:6.2f} s, each later one "
                  f"{later:6.2f} s (median)" if later is not None else "")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
