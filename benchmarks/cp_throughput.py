"""Context-parallel throughput, measured side by side in one run.

``shardlab train``'s default model (llama, 4 layers, d_model 64, 4 heads, the garden
vocabulary) at a sequence of 1,024 tokens, trained with ``shardlab.train.loop.train_rank``
on one process (one thread) against the same model, batches and optimizer on two
processes with context parallelism (``cp=2``, one thread per rank): each rank holds two
of the four 256-token chunks of every sequence (chunks i and 3-i, Llama 3's balancing),
so its matmuls and its attention (its 512 queries against all 1,024 keys) halve, while
K and V are all-gathered in every layer and FSDP shards the weights over the two ranks.
The ratio of tokens/s (target >= 1.3 on a 2-core machine; issue 17).

At this length attention is most of the work (per token forward, 4·s·d·L = 1.0 MFLOP
of scores and weighted values against 2·16·d²·L = 0.5 MFLOP of the layers' weight
matmuls), the regime context parallelism is for.

The machine's load average (``os.getloadavg``) is printed before and after: other work on
the same cores (shared CI runners, other sessions) lowers the ratio, and a ratio read
without it means little. Each layout runs ``--repeats`` times, interleaved with the
other; the medians of their steps after the first. Run:
``python benchmarks/cp_throughput.py [--steps N] [--repeats R] [--seq S] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from shardlab.config.model import ModelShape
from shardlab.distributed.launch import launch
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.train.config import TrainConfig, check_config

TARGET = 1.3


def default_shape(seq: int) -> ModelShape:
    """``shardlab train``'s model when no MODEL is given (its shape flags' defaults), with
    a context of ``seq`` tokens."""
    return ModelShape("flags", 4, 64, 4, garden_vocab().size, seq, style="llama", tied=False)


def steps_after_first(ranks: list[dict]) -> list[float]:
    """Seconds of every step after the first (rank 0's clock; steps end in a barrier)."""
    return ranks[0]["step_seconds"][1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each layout, interleaved (the load on shared cores moves)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = {"shape": default_shape(args.seq), "global_batch": args.global_batch,
            "seq": args.seq, "steps": args.steps, "warmup": 1,
            "docs": garden_documents(2000, 0)}
    runs = {"one": TrainConfig(**base), "cp2": TrainConfig(**base, cp=2)}
    for cfg in runs.values():
        check_config(cfg)
    load_before = os.getloadavg()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, cfg in runs.items():
            seconds[name] += steps_after_first(launch("shardlab.train.loop:train_rank",
                                                      cfg.world, (cfg,), timeout_s=600,
                                                      threads=1))
    t = {name: statistics.median(v) for name, v in seconds.items()}
    load_after = os.getloadavg()
    tokens = args.global_batch * args.seq
    ratio = t["one"] / t["cp2"]
    doc = {"model": runs["one"].shape.describe(), "tokens_per_step": tokens,
           "step_s": t, "tokens_per_s": {k: tokens / v for k, v in t.items()},
           "cp2_vs_one": ratio, "target": TARGET, "cpus": os.cpu_count(),
           "load_average_before": list(load_before), "load_average_after": list(load_after)}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"model: {doc['model']}; {tokens} tokens per step ({args.global_batch} x "
              f"{args.seq})")
        print(f"one process x 1 thread:         {tokens / t['one']:8.0f} tokens/s")
        print(f"cp=2, 2 processes x 1 thread:   {tokens / t['cp2']:8.0f} tokens/s "
              f"(ratio {ratio:.2f}, target >= {TARGET})")
        print(f"load average (1, 5, 15 min) before {load_before[0]:.2f} {load_before[1]:.2f} "
              f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} "
              f"{load_after[2]:.2f} on {os.cpu_count()} CPUs")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
