"""The experiments ``shardlab verify`` runs, in order, and where each one lives.

An experiment module has ``run(ctx, work_dir) -> list[dict]``, called on every rank in
the same order (so their collectives line up), returning checks
``{"name", "value", "tolerance", "passed"}`` (plus optional ``"detail"``); rank 0's list
is reported. It may also have ``after(work_dir) -> list[dict]``, run once in the
calling process after the ranks have exited (no process group: e.g. loading a
distributed checkpoint into one unsharded model).
"""

from __future__ import annotations

GLOBAL_BATCH = 8
"""Sequences in the experiments' global batches: the world size must divide it (here, in
the torch-free registry, so the command checks it before anything imports torch)."""

EXPERIMENTS: dict[str, tuple[str, str]] = {
    "ddp_token_weighting": ("shardlab.verify.ddp", "DDP with the loss weighted by the global "
                            "real-token count equals the full-batch update; mean of means not"),
    "activation_checkpointing": ("shardlab.verify.checkpointing", "saved-tensor bytes fall, "
                                 "forward calls rise, outputs and gradients equal"),
    "tp_algebra": ("shardlab.verify.tp_algebra", "column split concatenates, row split sums"),
    "precision": ("shardlab.verify.precision", "FP32/FP16/BF16 representation; CPU autocast "
                  "dtypes of output, weight and grad"),
    "gloo_avg": ("shardlab.verify.gloo_avg", "does reduce-scatter honour ReduceOp.AVG?"),
    "fsdp2": ("shardlab.verify.fsdp2", "fully_shard + AdamW equals one process (fp32 and bf16 "
              "MixedPrecisionPolicy); Shard(0) DTensors at ~1/world numel"),
    "tensor_parallel": ("shardlab.verify.tensor_parallel", "ColwiseParallel/RowwiseParallel "
                        "on an MLP and on shardlab's attention block equal unsharded"),
    "dtensor": ("shardlab.verify.dtensor_tour", "DTensor redistribute: Shard->Replicate, "
                "Partial->Replicate, Partial->Shard, Shard(0)->Shard(1), full_tensor"),
    "pipelining": ("shardlab.verify.pipelining", "PipelineStage with ScheduleGPipe and "
                   "Schedule1F1B: last-stage losses equal per-micro-batch references"),
    "checkpoint": ("shardlab.verify.checkpoint", "DCP save, load into a fresh sharded model, "
                   "reshard to one process, dcp_to_torch_save"),
}


def check(name: str, value: float, tolerance: float, detail: str = "",
          passed: bool | None = None) -> dict[str, object]:
    """One check; passes when ``value <= tolerance`` unless ``passed`` says otherwise."""
    ok = bool(value <= tolerance) if passed is None else bool(passed)
    return {"name": name, "value": float(value), "tolerance": float(tolerance), "passed": ok,
            "detail": detail}
