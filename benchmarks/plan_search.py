"""How fast is the planner's full search? Llama-3.1-405B on 16,384 H100s (8 per node),
sequence 8192, global batch 2048 sequences (16M tokens): the issue's figure is under 2 s.

    python benchmarks/plan_search.py [--repeats 5]

Prints the number of layouts, the median search time and layouts per second.
"""

from __future__ import annotations

import argparse
import statistics
import time

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.plan.search import plan
from shardlab.plan.space import Space


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    model, acc = get_model("llama-3.1-405b"), get_accelerator("H100 SXM")
    space = Space(gpus=16384, global_batch=2048, seq=8192, gpus_per_node=8)
    times = []
    for _ in range(a.repeats):
        start = time.perf_counter()
        p = plan(model, acc, space, get_policy("bf16"), top=10)
        times.append(time.perf_counter() - start)
    med = statistics.median(times)
    best = p.best[0]
    print(f"layouts: {p.candidates_evaluated:,} evaluated, {p.feasible:,} fit")
    print(f"search: median {med:.3f} s of {a.repeats} (first {times[0]:.3f} s, with the "
          f"schedule simulations it caches), {p.candidates_evaluated / med:,.0f} layouts/s")
    print(f"target: < 2 s -> {'met' if med < 2 else 'NOT met'}")
    print(f"winner: dp={best['dp']} tp={best['tp']} pp={best['pp']} v={best['virtual_stages']} "
          f"{best['schedule']} zero={best['zero']} sp={int(best['sp'])} {best['recompute']} "
          f"mb={best['micro_batch']}: {best['step_seconds']:.2f} s/step, MFU {best['mfu']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
