"""How fast ``shardlab schedule`` answers on a large schedule, old output path beside new, in
one run.

The case is issue 22's: interleaved 1F1B on p = 64 ranks, v = 2 chunks, m = 512
micro-batches, 131,072 compute actions.

1. In this process, alternating so machine noise hits each alike (median of ``--runs``):
   writing the JSON document with every action as before issue 22 (``json.dump`` with
   ``indent=2``, which runs json's pure-Python encoder, after the old ``_clean`` walk)
   beside ``print_json(compact=True)`` (one line, json's C encoder) and beside the summary
   alone (the default now); the action list as JSON lines and as a Chrome trace; and the
   phases before any output: build, simulate (placement in time), the summary.
2. The command line, each run its own process (median and worst of ``--runs``), against
   issue 22's targets: ``--json`` at most 2 s; ``--json --actions`` to a file and
   ``--actions-out`` (.jsonl, .json) at most 4 s.

Prints the processor (``/proc/cpuinfo``), the cores and the load average, since a shared
machine's load moves every figure. Exit code 1 when a target is missed.

    python benchmarks/schedule_speed.py [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardlab.cli.output import Vouched, print_json
from shardlab.cli.schedule import summary
from shardlab.schedules.generators import build
from shardlab.schedules.simulate import Durations, simulate
from shardlab.schedules.stream import timeline, write_chrome_trace, write_jsonl

P, M, V = 64, 512, 2
CASE = ["--kind", "interleaved-1f1b", "--stages", str(P), "--microbatches", str(M),
        "--virtual", str(V)]
TARGETS = {"summary": 2.0, "actions": 4.0, "jsonl": 4.0, "trace": 4.0}
"""Issue 22's wall-time targets, seconds."""


def processor() -> str:
    """The processor's name as /proc/cpuinfo gives it (the platform's word elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def clean_before(x: Any) -> Any:
    """``shardlab.cli.output._clean`` as it was before issue 22: a call per value."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): clean_before(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [clean_before(v) for v in x]
    return x


def seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def in_process(runs: int, folder: Path) -> dict[str, float]:
    """Median seconds of each phase and each way of writing the output."""
    d = Durations()
    sched = build("interleaved-1f1b", P, M, V)
    timing = simulate(sched, d)
    full = {**summary(timing, d, None), "timeline": timeline(timing)}
    vouched = {**full, "timeline": Vouched(full["timeline"])}  # as the command passes it
    out = folder / "out"

    def dump_before() -> None:
        with out.open("w") as f:
            json.dump(clean_before(full), f, indent=2)
            f.write("\n")

    def dump(doc: dict[str, Any], compact: bool) -> None:
        with out.open("w") as f, contextlib.redirect_stdout(f):
            print_json(doc, compact=compact)

    def write(writer: Callable[..., None]) -> None:
        with out.open("wb") as f:
            writer(timing, f)

    fresh: list[Any] = []  # a schedule not timed yet: its flat arrays are built once, cached

    def place() -> None:
        simulate(fresh.pop(), d)

    steps: dict[str, Callable[[], object]] = {
        "build": lambda: fresh.append(build("interleaved-1f1b", P, M, V)),
        "simulate": place,
        "summary_doc": lambda: summary(timing, d, None),
        "actions_indented_before": dump_before,
        "actions_one_line_now": lambda: dump(vouched, True),
        "summary_only_now": lambda: dump(summary(timing, d, None), False),
        "timeline_rows": lambda: timeline(timing),
        "jsonl": lambda: write(write_jsonl),
        "chrome_trace": lambda: write(write_chrome_trace),
    }
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(runs):
        for name, fn in steps.items():
            times[name].append(seconds(fn))
    return {k: statistics.median(v) for k, v in times.items()}


def cli(runs: int, folder: Path) -> dict[str, list[float]]:
    """Wall seconds of each command, every run its own process, alternating."""
    base = [sys.executable, "-m", "shardlab", "schedule", *CASE]
    commands = {
        "summary": ([*base, "--json"], None),
        "actions": ([*base, "--json", "--actions"], folder / "doc.json"),
        "jsonl": ([*base, "--json", "--actions-out", str(folder / "a.jsonl")], None),
        "trace": ([*base, "--json", "--actions-out", str(folder / "a.json")], None),
    }
    walls: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(runs):
        for name, (argv, stdout_file) in commands.items():
            with open(stdout_file or os.devnull, "w") as sink:
                t0 = time.perf_counter()
                subprocess.run(argv, stdout=sink, check=True)
                walls[name].append(time.perf_counter() - t0)
    return walls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    machine = {"processor": processor(), "cores": os.cpu_count(),
               "load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        phases = in_process(args.runs, Path(tmp))
        walls = cli(args.runs, Path(tmp))
        sizes = {"actions": (Path(tmp) / "doc.json").stat().st_size,
                 "jsonl": (Path(tmp) / "a.jsonl").stat().st_size,
                 "trace": (Path(tmp) / "a.json").stat().st_size}
    ratio = phases["actions_indented_before"] / phases["actions_one_line_now"]
    met = {k: max(walls[k]) <= TARGETS[k] for k in TARGETS}
    doc = {"machine": machine, "case": {"p": P, "m": M, "v": V, "actions": 2 * P * M * V},
           "in_process_median_s": phases, "indented_over_one_line": ratio,
           "cli_wall_s": walls, "file_bytes": sizes, "targets_s": TARGETS, "met": met,
           "runs": args.runs}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{machine['processor']}, {machine['cores']} cores, load average "
              + " ".join(f"{x:.2f}" for x in machine["load_average"]))
        print(f"interleaved-1f1b p={P} v={V} m={M}: {2 * P * M * V:,} actions, "
              f"median of {args.runs} runs")
        for name, s in phases.items():
            print(f"  {name:<26} {s:7.3f} s")
        print(f"  the action list indented as before / on one line now: {ratio:.1f}x")
        for name, w in walls.items():
            size = f", {sizes[name] / 1e6:.1f} MB" if name in sizes else ""
            print(f"  shardlab schedule ... {name:<8} wall median {statistics.median(w):.2f} s, "
                  f"worst {max(w):.2f} s (target <= {TARGETS[name]:g} s: "
                  f"{'ok' if met[name] else 'MISSED'}){size}")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
