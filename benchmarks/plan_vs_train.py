"""Does the planner rank layouts the way `shardlab train` measures them on this machine?

For a small llama-style model on this machine's 2 processes, evaluates a few layouts with
`shardlab plan --gpu cpu --layout ...` (needs `shardlab hardware --measure` first), then
runs each layout's `train_command` for a few steps, ``--rounds`` times round-robin (every
layout once per round, so load from other jobs falls on all of them alike), and prints
predicted beside the median measured tokens/s, the spread of the measurements, both
ranks, the Spearman rank correlation and the share of layout pairs the planner orders
as measured. The 1-minute load average is printed before and after each round.

    python benchmarks/plan_vs_train.py [--rounds 3] [--steps 6] [--d-model 256] [--seq 128]
                                       [--remeasure]

``--remeasure`` runs ``shardlab hardware --measure`` first (matmul rates, gloo's collectives,
the runtime's fixed costs per parallel style), so the prediction and the runs it is
compared with see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from itertools import combinations

from shardlab.cli import build_parser
from shardlab.cli.plan import plan_document

LAYOUTS = (
    "dp=2 zero=0 micro_batch=8",
    "dp=2 zero=3 micro_batch=8",
    "dp=2 zero=0 micro_batch=2",
    "tp=2 dp=1 micro_batch=16",
    "pp=2 dp=1 micro_batch=4 schedule=1f1b",
    "pp=2 dp=1 micro_batch=2 schedule=gpipe",
)


def ranks(values: list[float]) -> list[int]:
    """Rank 1 for the largest value (ties broken by order)."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0] * len(values)
    for r, i in enumerate(order, 1):
        out[i] = r
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation 1 - 6·Σd²/(n(n²-1)) of two equally long lists."""
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1))


def pairs_ordered(a: list[float], b: list[float]) -> tuple[int, int]:
    """(pairs that a and b order the same way, all pairs)."""
    idx = list(combinations(range(len(a)), 2))
    return sum((a[i] > a[j]) == (b[i] > b[j]) for i, j in idx), len(idx)


def load() -> str:
    """The 1, 5 and 15-minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--remeasure", action="store_true",
                    help="run `shardlab hardware --measure` before predicting")
    a = ap.parse_args()
    if a.remeasure:
        print(f"measuring this machine; load average: {load()}", flush=True)
        subprocess.run([sys.executable, "-m", "shardlab", "hardware", "--measure", "--json"],
                       check=True, capture_output=True, timeout=600)
    predicted, commands, parts = [], [], []
    for text in LAYOUTS:
        args = build_parser().parse_args([
            "plan", "--gpu", "cpu", "--gpus", "2", "--d-model", str(a.d_model), "--layers",
            str(a.layers), "--heads", "4", "--seq", str(a.seq), "--global-batch",
            str(a.global_batch), "--layout", text])
        best = plan_document(args)["best"][0]
        predicted.append(best["tokens_per_second"])
        parts.append(best["breakdown"])
        cmd = shlex.split(best["train_command"])
        commands.append([sys.executable, "-m", "shardlab", *cmd[1:], "--steps",
                         str(a.steps), "--json"])
    print(f"{os.cpu_count()} cores; load average (1, 5, 15 min) at start: {load()}")
    measured: list[list[float]] = [[] for _ in LAYOUTS]
    for r in range(a.rounds):
        for i, cmd in enumerate(commands):
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                print(f"{LAYOUTS[i]}: train failed: {out.stderr.strip()[-300:]}")
                return 1
            measured[i].append(json.loads(out.stdout)["tokens_per_s"])
        print(f"round {r + 1}/{a.rounds} done; load average: {load()}", flush=True)
    med = [statistics.median(m) for m in measured]
    pr, mr = ranks(predicted), ranks(med)
    print()
    print(f"{'layout':40s} {'predicted':>10s} {'measured':>10s} {'min-max':>13s} "
          f"{'m/p':>5s} {'rank p':>6s} {'rank m':>6s}  predicted overhead, comm, bubble (ms)")
    for i, text in enumerate(LAYOUTS):
        print(f"{text:40s} {predicted[i]:10.0f} {med[i]:10.0f} "
              f"{min(measured[i]):6.0f}-{max(measured[i]):<6.0f} {med[i] / predicted[i]:5.2f} "
              f"{pr[i]:6d} {mr[i]:6d}  {parts[i]['overhead'] * 1e3:5.0f} "
              f"{sum(parts[i][k] for k in ('tp_comm', 'pp_comm', 'dp_comm')) * 1e3:5.0f} "
              f"{parts[i]['bubble'] * 1e3:5.0f}")
    agree, total = pairs_ordered(predicted, med)
    print(f"tokens/s: measured = median of {a.rounds} round-robin runs of {a.steps} steps")
    print(f"pairs ordered as measured: {agree}/{total}; Spearman rank correlation "
          f"{spearman(predicted, med):.2f}; winner predicted {LAYOUTS[pr.index(1)]!r}, "
          f"measured {LAYOUTS[mr.index(1)]!r}")
    print(f"load average at end: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
