"""What a simulated run may ask of this host: every virtual device lives in one process, so
its memory is the sum over devices, and its time grows with their number.

:func:`run_peak_bytes` is the cost model's peak of ``shardlab simulate``'s one process:

* each virtual device: its stage's weights and gradients whole (ZeRO-3 gathers the
  weights per replica for every forward and backward, and every device accumulates whole
  gradients before the reduce-scatter; a MoE model's routed experts divided by ep),
  AdamW's two moments (sharded over dp_shard x cp under ZeRO 1-3, routed experts over
  dp/ep, plus the flat weight and gradient shards), and the activations
  :func:`~shardlab.estimate.memory.stage_memory` gives its pipeline stage;
* the one-device reference: the whole model's states, and the activations of the whole
  global batch in one micro-batch;
* :data:`RUNTIME_BYTES` for the interpreter with torch.

:data:`MAX_DEVICES` bounds the virtual devices whatever memory there is: the simulator
runs them one after another in Python.
"""

from __future__ import annotations

from shardlab.config.layout import Layout, make_layout
from shardlab.config.model import ModelShape
from shardlab.estimate.context import shard_group
from shardlab.estimate.memory import stage_memory
from shardlab.estimate.partition import layout_params_split

MAX_DEVICES = 256
"""Most virtual devices (dp x cp x tp x pp) one run may have. Time grows with them: one step of
the default 4-layer model took 90 s with 64 and 334 s with 256 on the 2-core build
machine."""

RUNTIME_BYTES = 300 * 2**20
"""Resident memory of the simulating process before any tensor (bytes): the interpreter,
torch and shardlab, measured at 280-300 MiB (torch 2.x on Linux)."""


def device_peak_bytes(shape: ModelShape, lay: Layout) -> list[float]:
    """Bytes one virtual device of each pipeline stage holds at its peak (module docstring)."""
    p = lay.dtype
    params = layout_params_split(shape, lay, vocab_parallel=False)
    stages = stage_memory(shape, lay, dropout=False)
    out = []
    for (dense, experts), st in zip(params, stages, strict=True):
        n = dense + experts
        whole = n * (p.weight_bytes + p.grad_bytes)
        if lay.zero:  # the optimizer's moments on a flat shard, and the shards themselves
            sharded = ((dense / shard_group(lay) + experts / lay.expert_dp)
                       * (p.optimizer_bytes + p.weight_bytes + p.grad_bytes))
        else:
            sharded = n * p.optimizer_bytes
        out.append(whole + sharded + st.activations)
    return out


def reference_peak_bytes(shape: ModelShape, lay: Layout) -> float:
    """Bytes the one-device reference holds: the whole model trained on the global batch."""
    one = make_layout(shape, micro_batch=lay.global_batch, global_batch=lay.global_batch,
                      seq=lay.seq, dtype=lay.dtype.name)
    return stage_memory(shape, one, dropout=False)[0].total


def run_peak_bytes(shape: ModelShape, lay: Layout) -> float:
    """The cost model's peak of the whole simulated run, in one process (bytes)."""
    per_stage = device_peak_bytes(shape, lay)
    return (RUNTIME_BYTES + reference_peak_bytes(shape, lay)
            + lay.dp * lay.cp * lay.tp * sum(per_stage))
