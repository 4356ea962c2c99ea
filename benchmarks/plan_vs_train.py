"""Does the planner rank layouts the way `shardlab train` measures them on this machine?

For a small llama-style model on this machine's 2 processes, evaluates a few layouts with
`shardlab plan --gpu cpu --layout ...` (needs `shardlab hardware --measure` first), runs
each winner's `train_command` for a few steps, and prints predicted beside measured
tokens/s, the ranks, and the share of layout pairs the planner orders as measured.

    python benchmarks/plan_vs_train.py [--steps 6] [--d-model 256] [--seq 128]
"""

from __future__ import annotations

import argparse
import json
import shlex
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--global-batch", type=int, default=16)
    a = ap.parse_args()
    rows = []
    for text in LAYOUTS:
        args = build_parser().parse_args([
            "plan", "--gpu", "cpu", "--gpus", "2", "--d-model", str(a.d_model), "--layers",
            str(a.layers), "--heads", "4", "--seq", str(a.seq), "--global-batch",
            str(a.global_batch), "--layout", text])
        best = plan_document(args)["best"][0]
        cmd = shlex.split(best["train_command"])
        cmd = [sys.executable, "-m", "shardlab", *cmd[1:], "--steps", str(a.steps), "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            print(f"{text}: train failed: {out.stderr.strip()[-300:]}")
            return 1
        measured = json.loads(out.stdout)["tokens_per_s"]
        rows.append((text, best["tokens_per_second"], measured))
        print(f"{text:40s} predicted {best['tokens_per_second']:9.0f} tokens/s   "
              f"measured {measured:9.0f} tokens/s", flush=True)
    pred_rank = {r[0]: i for i, r in enumerate(sorted(rows, key=lambda r: -r[1]), 1)}
    meas_rank = {r[0]: i for i, r in enumerate(sorted(rows, key=lambda r: -r[2]), 1)}
    print()
    print(f"{'layout':40s} {'predicted':>10s} {'measured':>10s} {'ratio':>6s} "
          f"{'rank p':>6s} {'rank m':>6s}")
    for text, p, m in rows:
        print(f"{text:40s} {p:10.0f} {m:10.0f} {m / p:6.2f} {pred_rank[text]:6d} "
              f"{meas_rank[text]:6d}")
    pairs = list(combinations(rows, 2))
    agree = sum((x[1] > y[1]) == (x[2] > y[2]) for x, y in pairs)
    n = len(rows)
    d2 = sum((pred_rank[t] - meas_rank[t]) ** 2 for t, _, _ in rows)
    print(f"pairs ordered as measured: {agree}/{len(pairs)}; Spearman rank correlation "
          f"{1 - 6 * d2 / (n * (n * n - 1)):.2f}; winner predicted "
          f"{min(pred_rank, key=pred_rank.get)!r}, measured {min(meas_rank, key=meas_rank.get)!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
