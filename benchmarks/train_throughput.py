"""Training throughput, measured side by side in one run.

1. shardlab's single-process training loop (``shardlab.train.loop.train_rank`` on one rank)
   against a plain PyTorch loop training the same model on the same batches with the
   same optimizer, both with one thread: the ratio of their tokens/s (target >= 0.95).
2. dp=2 (DDP by default, --dp-mode to change; one thread per rank) against the single
   process (one thread): the ratio of tokens/s (target >= 1.5 on a 2-core machine).

Medians of the steps after the first. Run: ``python benchmarks/train_throughput.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from shardlab.config.model import ModelShape
from shardlab.distributed.launch import launch
from shardlab.nn.data import batches
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.model import TransformerLM
from shardlab.train.config import TrainConfig
from shardlab.train.optimizer import make_optimizer
from shardlab.train.reference import token_loss_sum


def plain_loop(cfg: TrainConfig) -> float:
    """Median seconds per step of the textbook loop on one thread."""
    torch.set_num_threads(1)
    model = TransformerLM(cfg.shape, seed=cfg.seed)
    opt, _ = make_optimizer(list(model.parameters()), cfg)
    stream = batches(cfg.docs, cfg.global_batch, cfg.seq, seed=cfg.seed)
    times = []
    for _ in range(cfg.steps):
        b = next(stream)
        start = time.perf_counter()
        loss = token_loss_sum(model(b.input_ids, b.pad_mask), b) / b.real_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dp-mode", default="ddp", choices=("ddp", "fsdp", "fsdp-zero2"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    shape = ModelShape("bench", 4, 256, 8, garden_vocab().size, 128, d_ff=1024,
                       style="llama", tied=False)
    base = {"shape": shape, "global_batch": 16, "seq": 128, "steps": args.steps, "warmup": 1,
            "docs": garden_documents(2000, 0)}
    one = TrainConfig(**base)
    two = TrainConfig(**base, dp=2, dp_mode=args.dp_mode)
    t_plain = plain_loop(one)
    r1 = launch("shardlab.train.loop:train_rank", 1, (one,), timeout_s=120, threads=1)
    r2 = launch("shardlab.train.loop:train_rank", 2, (two,), timeout_s=120, threads=1)
    t1 = statistics.median(r1[0]["step_seconds"][1:])
    t2 = statistics.median(r2[0]["step_seconds"][1:])
    doc = {"plain_step_s": t_plain, "shardlab_step_s": t1, "dp2_step_s": t2,
           "shardlab_vs_plain": t_plain / t1, "dp2_vs_single": t1 / t2}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        tokens = one.global_batch * one.seq
        print(f"plain loop, 1 thread:        {tokens / t_plain:8.0f} tokens/s")
        print(f"shardlab, 1 rank x 1 thread: {tokens / t1:8.0f} tokens/s "
              f"(ratio {t_plain / t1:.2f}, target >= 0.95)")
        print(f"shardlab, dp=2 x 1 thread:   {tokens / t2:8.0f} tokens/s "
              f"(ratio {t1 / t2:.2f} to one rank, target >= 1.5)")
    return 0 if t_plain / t1 >= 0.95 and t1 / t2 >= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
