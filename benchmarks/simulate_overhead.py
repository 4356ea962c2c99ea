"""What the virtual devices cost: a simulated dp=8 step against one device, side by side.

Both train the same model on the same global batch; the simulated step does the same
arithmetic split over 8 data-parallel replicas plus the bookkeeping (per-device
parameter copies, a counted ring all-reduce of the gradients, eight optimizer steps
on eight copies). The runs alternate so machine noise hits both; the script prints
both medians and their ratio and fails when the ratio exceeds the target (1.2).

    python benchmarks/simulate_overhead.py [--runs 5] [--dp 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from shardlab.config.model import ModelShape
from shardlab.nn.data import batches
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.model import TransformerLM
from shardlab.sim.engine import Parallel, Simulator
from shardlab.sim.reference import Reference

TARGET = 1.2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    shape = ModelShape("bench", 4, 256, 8, garden_vocab().size, 128, d_ff=1024, style="llama",
                       tied=False)
    stream = batches(garden_documents(2000, 0), 8 * args.dp, 128)
    model = TransformerLM(shape)
    sim = Simulator(shape, {n: p.detach() for n, p in model.named_parameters()},
                    Parallel(dp=args.dp))
    ref = Reference(model)
    warm = next(stream)
    sim.step(warm)
    ref.step(warm)
    t_sim, t_ref = [], []
    for _ in range(args.runs):
        b = next(stream)
        t0 = time.perf_counter()
        ref.step(b)
        t1 = time.perf_counter()
        sim.step(b)
        t2 = time.perf_counter()
        t_ref.append(t1 - t0)
        t_sim.append(t2 - t1)
    ms, mr = statistics.median(t_sim), statistics.median(t_ref)
    doc = {"dp": args.dp, "sim_median_s": ms, "one_device_median_s": mr, "ratio": ms / mr,
           "runs": args.runs, "target": TARGET}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"one device, global batch {8 * args.dp} x 128: median {mr * 1e3:.1f} ms")
        print(f"simulated dp={args.dp}, same batch:   median {ms * 1e3:.1f} ms")
        print(f"ratio {ms / mr:.2f} (target <= {TARGET}):", "ok" if ms / mr <= TARGET else "NO")
    return 0 if ms / mr <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
