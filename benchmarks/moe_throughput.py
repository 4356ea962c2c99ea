"""Expert-parallel throughput, measured side by side in one run.

A mixture of experts trained with ``shardlab.train.loop.train_rank`` on one process (one
thread) against the same model, batches and optimizer on two processes with expert
parallelism (``dp=2 ep=2``, one thread per rank): each rank holds half of every MoE
layer's experts and half the batch, so its compute halves while the tokens travel to
their experts and back by all-to-all. The ratio of tokens/s (target >= 1.3 on a 2-core
machine; issue 16). For context, plain data parallelism (``dp=2``, every rank all the
experts) on the same two processes.

The data-parallel mode is ``fsdp-zero2`` by default (``--dp-mode``): the dense weights
gathered once per step rather than twice, which on gloo's CPU all-gathers is most of the
difference between ZeRO-3 and ZeRO-2 here; with expert_dp = 1 the experts are never
gathered at all.

The machine's load average (``os.getloadavg``) is printed before and after: other work on
the same cores (shared CI runners, other sessions) lowers the ratio, and a ratio read
without it means little. Each layout runs ``--repeats`` times, interleaved with the others;
the medians of their steps after the first. Run:
``python benchmarks/moe_throughput.py [--steps N] [--repeats R] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from shardlab.config.model import ModelShape, MoE
from shardlab.distributed.launch import launch
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.train.config import TrainConfig

TARGET = 1.3


def moe_shape() -> ModelShape:
    """A small Mixtral-like model whose experts hold most of the compute: 8 experts of
    width 1024, top-2, one shared expert, the first of 4 layers dense."""
    return ModelShape("bench-moe", 4, 256, 8, garden_vocab().size, 128, d_ff=512,
                      style="llama", tied=False,
                      moe=MoE(8, 2, 1024, shared_experts=1, shared_d_ff=256, dense_layers=1))


def steps_after_first(ranks: list[dict]) -> list[float]:
    """Seconds of every step after the first (rank 0's clock; steps end in a barrier)."""
    return ranks[0]["step_seconds"][1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each layout, interleaved (the load on shared cores moves)")
    ap.add_argument("--dp-mode", default="fsdp-zero2", choices=("fsdp", "fsdp-zero2"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = {"shape": moe_shape(), "global_batch": 16, "seq": 128, "steps": args.steps,
            "warmup": 1, "docs": garden_documents(2000, 0)}
    one = TrainConfig(**base)
    runs = {"one": one, "dp2": TrainConfig(**base, dp=2, dp_mode=args.dp_mode),
            "ep2": TrainConfig(**base, dp=2, ep=2, dp_mode=args.dp_mode)}
    load_before = os.getloadavg()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, cfg in runs.items():
            seconds[name] += steps_after_first(launch("shardlab.train.loop:train_rank",
                                                      cfg.world, (cfg,), timeout_s=300,
                                                      threads=1))
    t = {name: statistics.median(v) for name, v in seconds.items()}
    load_after = os.getloadavg()
    tokens = one.global_batch * one.seq
    t1, t2 = t["one"], t["ep2"]
    doc = {"model": one.shape.describe(), "tokens_per_step": tokens, "dp_mode": args.dp_mode,
           "step_s": t, "tokens_per_s": {k: tokens / v for k, v in t.items()},
           "ep2_vs_one": t1 / t2, "dp2_vs_one": t1 / t["dp2"], "target": TARGET,
           "cpus": os.cpu_count(), "load_average_before": list(load_before),
           "load_average_after": list(load_after)}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"model: {doc['model']}; {tokens} tokens per step; {args.dp_mode}")
        print(f"one process x 1 thread:              {tokens / t1:8.0f} tokens/s")
        print(f"dp=2, 2 processes x 1 thread:        {tokens / t['dp2']:8.0f} tokens/s "
              f"(ratio {t1 / t['dp2']:.2f})")
        print(f"dp=2 ep=2, 2 processes x 1 thread:   {tokens / t2:8.0f} tokens/s "
              f"(ratio {t1 / t2:.2f}, target >= {TARGET})")
        print(f"load average (1, 5, 15 min) before {load_before[0]:.2f} {load_before[1]:.2f} "
              f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} "
              f"{load_after[2]:.2f} on {os.cpu_count()} CPUs")
    return 0 if t1 / t2 >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
