"""How the schedule simulator's cost grows: two sizes timed side by side in one run.

Builds and simulates interleaved 1F1B with p=64 ranks, v=2 chunks and m=512
micro-batches (131,072 compute actions and as many point-to-point messages), and
the same with m=256 (half the actions). The simulator is list scheduling in
program order, so its time should grow in proportion to the actions: the printed
ratio time(big)/time(small) divided by actions(big)/actions(small) should be close
to 1. Also checks the big case takes under 2 s (the target of issue 3).

    python benchmarks/schedule_scaling.py [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from shardlab.schedules.generators import build
from shardlab.schedules.simulate import simulate


def _time(p: int, m: int, v: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    s = build("interleaved-1f1b", p, m, v)
    simulate(s)
    return s.num_actions, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    big, small = [], []
    for _ in range(args.runs):  # alternate so machine noise hits both sizes alike
        n_big, t = _time(64, 512, 2)
        big.append(t)
        n_small, t = _time(64, 256, 2)
        small.append(t)
    tb, ts = statistics.median(big), statistics.median(small)
    linearity = (tb / ts) / (n_big / n_small)
    doc = {"big_actions": n_big, "small_actions": n_small, "big_median_s": tb,
           "small_median_s": ts, "time_ratio": tb / ts, "action_ratio": n_big / n_small,
           "linearity": linearity, "runs": args.runs}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"p=64 v=2 m=512: {n_big:,} actions, build+simulate median {tb:.3f} s")
        print(f"p=64 v=2 m=256: {n_small:,} actions, build+simulate median {ts:.3f} s")
        print(f"time ratio {tb / ts:.2f} for action ratio {n_big / n_small:.2f}: "
              f"linearity {linearity:.2f} (1.00 = linear)")
        print("big case under 2 s:", "ok" if tb < 2.0 else "NO")
    return 0 if tb < 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
