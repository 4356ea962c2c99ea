"""Start-up cost of ``shardlab budget`` against ``import torch``, side by side.

What it measures: the wall time of a whole fresh process, from spawn to exit, for

* ``python -m shardlab budget hypo-100b --json`` (stdout to /dev/null), and
* ``python -c "import torch"``,

each run ``--runs`` times (default 7), interleaved (budget, torch, budget, torch, ...)
after one untimed warm-up run of each, so that machine noise (other jobs, CPU
frequency, the page cache) falls on both sides alike. It prints both medians and the
ratio budget / torch; medians, because one stray slow run must not decide the ratio.

Why: ``shardlab budget`` is a closed-form calculator meant to answer on a laptop in
less time than it takes to merely import torch; the project's target is a ratio under
one half. The budget path must therefore never import torch (or anything of similar
weight) at start-up. The command exits 1 when the ratio is >= 0.5, 2 when either
command fails, else 0.

Only the standard library is used; the interpreter is this one (``sys.executable``),
so run it with the project's virtual environment, which must have the torch extra::

    .venv/bin/python benchmarks/budget_startup.py [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from shardlab.cli.args import positive_int

TARGET_RATIO = 0.5
BUDGET_CMD = [sys.executable, "-m", "shardlab", "budget", "hypo-100b", "--json"]
TORCH_CMD = [sys.executable, "-c", "import torch"]


def time_once(cmd: list[str]) -> float:
    """Seconds of wall time for one run of ``cmd`` (stdout discarded); raise if it fails."""
    start = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - start
    if p.returncode != 0:
        tail = p.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {tail[0]}")
    return elapsed


@dataclass(frozen=True)
class Result:
    """Raw samples (seconds) of both commands, in the order they ran."""

    budget_s: list[float]
    torch_s: list[float]

    @property
    def budget_median_s(self) -> float:
        return statistics.median(self.budget_s)

    @property
    def torch_median_s(self) -> float:
        return statistics.median(self.torch_s)

    @property
    def ratio(self) -> float:
        return self.budget_median_s / self.torch_median_s

    def summary(self) -> dict[str, float | int]:
        return {"budget_median_s": self.budget_median_s, "torch_median_s": self.torch_median_s,
                "ratio": self.ratio, "runs": len(self.budget_s)}


def measure(runs: int) -> Result:
    """``runs`` timed runs of each command, strictly alternating budget, torch, budget, ..."""
    # One untimed run of each first, so neither side alone pays for a cold disk cache.
    time_once(BUDGET_CMD)
    time_once(TORCH_CMD)
    result = Result([], [])
    for _ in range(runs):
        result.budget_s.append(time_once(BUDGET_CMD))
        result.torch_s.append(time_once(TORCH_CMD))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=positive_int, default=7,
                        help="timed runs of each command (default 7)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document {budget_median_s, torch_median_s, "
                        "ratio, runs}")
    args = parser.parse_args(argv)
    try:
        r = measure(args.runs)
    except RuntimeError as e:
        sys.stderr.write(f"budget_startup: error: {e}\n")
        return 2
    ok = r.ratio < TARGET_RATIO
    if args.json:
        print(json.dumps(r.summary()))
    else:
        print(f"shardlab budget hypo-100b --json: median {r.budget_median_s * 1e3:8.1f} ms "
              f"over {args.runs} runs")
        print(f"python -c 'import torch':         median {r.torch_median_s * 1e3:8.1f} ms "
              f"over {args.runs} runs")
        print(f"ratio budget/torch: {r.ratio:.3f} (target < {TARGET_RATIO}): "
              f"{'ok' if ok else 'TOO SLOW'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
