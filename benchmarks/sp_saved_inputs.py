"""What DTensor sequence parallelism keeps for backward, measured on the running torch.

The planner's torchtitan memory fact ``MemoryFacts.sp_gathered_inputs``
(``src/shardlab/plan/memory_peak.py``) says that with tensor and sequence parallelism a
layer keeps its all-gathered linear input whole (T x h per rank), once for the linears
that share it, where Megatron-LM keeps the T x h / t shard and gathers it again in
backward. This script shows it: tp ranks on loopback gloo, torchtitan's plan of an
attention input (``SequenceParallel`` on the norm, the attention module's input gathered
to ``Replicate`` once by ``PrepareModuleInput``, wq and wk ``ColwiseParallel``, wo
``RowwiseParallel`` back to ``Shard(1)``), every tensor autograd saves in forward
recorded once per storage, printed by rank 0 as a multiple of T x h.

Seen with torch 2.13.0 on CPU, tp 2: the norm's input at 0.50 x T·h (the shard), **the
gathered input at 1.00 x T·h, once** (wq and wk share it), each projection's output at
0.50, and the weights.

Run: ``python benchmarks/sp_saved_inputs.py [--tp 2]``.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

B, S, H = 2, 64, 32


class Attention(nn.Module):
    """Two projections reading one input, a product, an output projection."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.wq = nn.Linear(h, h, bias=False)
        self.wk = nn.Linear(h, h, bias=False)
        self.wo = nn.Linear(h, h, bias=False)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.wo(self.wq(y) * self.wk(y))


class Block(nn.Module):
    """A norm, then the attention."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(h)
        self.attention = Attention(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(self.norm(x))


def _rank(rank: int, tp: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    try:
        mesh = init_device_mesh("cpu", (tp,))
        torch.manual_seed(0)
        block = Block(H)
        parallelize_module(block, mesh, {
            "norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                            desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        })
        x = distribute_tensor(torch.randn(B, S, H), mesh, [Shard(1)])
        saved: dict[int, tuple[tuple[int, ...], float]] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            local = t.to_local() if hasattr(t, "to_local") else t
            saved[local.untyped_storage().data_ptr()] = (tuple(local.shape),
                                                         local.numel() / (B * S * H))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = block(x)
        (out.to_local() if hasattr(out, "to_local") else out).sum().backward()
        if rank == 0:
            print(f"torch {torch.__version__}, tp {tp}, T x h = {B * S} x {H}: tensors "
                  "saved for backward (local shape, x T·h), one per storage")
            for shape, share in saved.values():
                print(f"  {shape!s:>14}  {share:.2f}")
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2, choices=(2, 4))
    args = parser.parse_args()
    with socket.socket() as s:  # a free loopback port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(args.tp, port), nprocs=args.tp)


if __name__ == "__main__":
    main()
