"""shardlab's FSDP2 and DDP runs against plain FSDP2 and DDP loops, side by side in one run.

Both train the same 4-layer llama (d 256, seq 128, global batch 16) on the same batches
with dp=2 on loopback gloo, one thread per rank, fp32, AdamW with clipping:

* shardlab: ``shardlab.train.loop.train_rank`` with ``dp_mode`` fsdp (per-block
  ``fully_shard``, then the root, as torchtitan) and ddp, through shardlab's launcher;
* plain: the textbook loops written here (``init_process_group``, ``fully_shard`` per
  block and on the root, or ``DistributedDataParallel`` around the model; forward,
  backward, ``clip_grad_norm_``, ``step``), started with ``torch.multiprocessing``.

The two alternate for ``--rounds`` rounds (A, B, A, B, ...) so a slow spell of the machine
falls on both; each side's figure is the median step (steps after the first) over its
rounds, rank 0's clock. Printed: the ratios of tokens/s, shardlab / plain for FSDP and
for DDP (targets >= 0.95, issue 22), and for context shardlab's DDP and fsdp-zero2
(``reshard_after_forward=False``) against its FSDP: what FSDP's per-step gathers cost
over DDP's one all-reduce on CPU.

Run: ``python benchmarks/fsdp_pair.py [--rounds 5] [--steps 8] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from shardlab.config.model import ModelShape
from shardlab.distributed.launch import launch
from shardlab.nn.data import batches
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.model import TransformerLM
from shardlab.train.config import TrainConfig
from shardlab.train.optimizer import make_optimizer
from shardlab.train.reference import token_loss_sum


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plain_rank(rank: int, world: int, cfg: TrainConfig, port: int, out: str) -> None:
    """One rank of the textbook FSDP2 loop (``cfg.dp_mode`` fsdp) or DDP loop (ddp);
    writes its step seconds to ``out/rank.json``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    model: torch.nn.Module = TransformerLM(cfg.shape, seed=cfg.seed)
    if cfg.dp_mode == "ddp":
        model = DistributedDataParallel(model)
    else:
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt, _ = make_optimizer(list(model.parameters()), cfg)
    stream = batches(cfg.docs, cfg.global_batch, cfg.seq, seed=cfg.seed)
    times = []
    for _ in range(cfg.steps):
        batch = next(stream)
        share = batch.split(world)[rank]
        dist.barrier()
        start = time.perf_counter()
        # FSDP and DDP average gradients over the ranks; x world makes them the sum of the shares'
        # token losses over the global batch's real tokens, as shardlab's.
        loss = token_loss_sum(model(share.input_ids, share.pad_mask), share)
        (loss * world / batch.real_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    Path(out, f"{rank}.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def plain_step(cfg: TrainConfig) -> float:
    """Median seconds per step (after the first) of the plain loop, rank 0."""
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(plain_rank, args=(cfg.dp, cfg, _free_port(), out), nprocs=cfg.dp,
                           start_method="spawn")
        return statistics.median(json.loads(Path(out, "0.json").read_text())[1:])


def shardlab_step(cfg: TrainConfig) -> float:
    """Median seconds per step (after the first) of shardlab's loop, rank 0."""
    ranks = launch("shardlab.train.loop:train_rank", cfg.dp, (cfg,), timeout_s=300, threads=1)
    return statistics.median(ranks[0]["step_seconds"][1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    shape = ModelShape("bench", 4, 256, 8, garden_vocab().size, 128, d_ff=1024,
                       style="llama", tied=False)
    base = {"shape": shape, "global_batch": 16, "seq": 128, "steps": args.steps, "warmup": 1,
            "docs": garden_documents(2000, 0), "dp": 2}
    cfgs = {mode: TrainConfig(**base, dp_mode=mode) for mode in ("fsdp", "fsdp-zero2", "ddp")}
    runs: dict[str, list[float]] = {"plain": [], "fsdp": [], "fsdp-zero2": [], "ddp": [],
                                    "plain-ddp": []}
    for _ in range(args.rounds):
        runs["fsdp"].append(shardlab_step(cfgs["fsdp"]))
        runs["plain"].append(plain_step(cfgs["fsdp"]))
        runs["fsdp-zero2"].append(shardlab_step(cfgs["fsdp-zero2"]))
        runs["ddp"].append(shardlab_step(cfgs["ddp"]))
        runs["plain-ddp"].append(plain_step(cfgs["ddp"]))
    step = {k: statistics.median(v) for k, v in runs.items()}
    doc = {"step_s": step, "rounds": runs, "load_average": os.getloadavg(),
           "shardlab_fsdp_vs_plain_fsdp": step["plain"] / step["fsdp"],
           "shardlab_ddp_vs_plain_ddp": step["plain-ddp"] / step["ddp"],
           "fsdp_zero2_vs_fsdp": step["fsdp"] / step["fsdp-zero2"],
           "ddp_vs_fsdp": step["fsdp"] / step["ddp"]}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        tokens = base["global_batch"] * base["seq"]
        labels = {"plain": "plain FSDP2 loop", "plain-ddp": "plain DDP loop"}
        for name in ("plain", "fsdp", "fsdp-zero2", "plain-ddp", "ddp"):
            label = labels.get(name, f"shardlab --dp-mode {name}")
            print(f"{label:30s} {tokens / step[name]:8.0f} tokens/s "
                  f"(median step {step[name] * 1e3:.1f} ms over {args.rounds} rounds)")
        print(f"shardlab fsdp / plain FSDP2: {doc['shardlab_fsdp_vs_plain_fsdp']:.3f}; "
              f"shardlab ddp / plain DDP: {doc['shardlab_ddp_vs_plain_ddp']:.3f} "
              "(targets >= 0.95)")
        print(f"fsdp-zero2 / fsdp: {doc['fsdp_zero2_vs_fsdp']:.3f};  ddp / fsdp: "
              f"{doc['ddp_vs_fsdp']:.3f};  load average {doc['load_average'][0]:.2f}")
    met = min(doc["shardlab_fsdp_vs_plain_fsdp"], doc["shardlab_ddp_vs_plain_ddp"]) >= 0.95
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
