"""Real training on a device mesh: ``shardlab train`` and ``python -m shardlab.train``.

One rank's loop, top to bottom: build the LM from its ModelShape with a fixed seed
(every rank the same), lay it out on a ``(pp, dp, tp)`` device mesh (pipeline stages,
then tensor parallel, activation checkpointing and FSDP2 or DDP, in torchtitan's
order), and per step: take this data-parallel rank's share of the global batch,
run its micro-batches (gradient accumulation, or the pipeline schedule), clip the
gradient norm over the whole sharded model, AdamW with warm-up and cosine decay.
Each rank's summed token loss is divided by the real tokens of the *whole* global
batch (x dp, because DDP and FSDP average over dp), so any layout trains the same
model as one process on the same batches (``--check-parity`` shows it).

The run's description and its checks are :mod:`shardlab.train.config`, the update
(AdamW, its schedule, clipping) :mod:`shardlab.train.optimizer`, and the one-process
parity reference :mod:`shardlab.train.reference`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor.parallel import loss_parallel

from shardlab.distributed.checkpoint import Checkpointer
from shardlab.distributed.checkpoint_manifest import read_manifest, shape_record
from shardlab.distributed.measure import (
    CommMeter,
    SavedBytesMeter,
    flop_counter,
    saved_activation_bytes,
    state_bytes,
)
from shardlab.distributed.parallelize import parallelize
from shardlab.distributed.pipeline import (
    build_schedule,
    pipeline_step,
    split_model,
    sync_tied_grads,
)
from shardlab.distributed.tensor_parallel import lm_loss_sum_any
from shardlab.hf.weights import read_weights
from shardlab.nn.data import batches
from shardlab.nn.model import TransformerLM
from shardlab.train.config import TrainConfig
from shardlab.train.optimizer import clip_grad_norm, make_optimizer


def load_initial_weights(model: Any, path: str) -> None:
    """Every parameter of the (not yet laid out) model from a safetensors file in
    shardlab's names (what ``shardlab import`` writes); strict: all names, all shapes."""
    model.load_state_dict(read_weights(path), strict=True)


def bf16_autocast(cfg: TrainConfig) -> Any:
    """``torch.autocast("cpu", bfloat16)`` when the run's dtype is bf16; else a null context."""
    if cfg.dtype == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class StepLog:
    """One step's metrics as rank 0 writes them (one JSON line each)."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    seconds: float
    tokens: int
    real_tokens: int


def _log(path: Path, record: StepLog) -> None:
    with path.open("a") as f:
        f.write(json.dumps(asdict(record)) + "\n")


def _no_sync(model: Any, cfg: TrainConfig, sync: bool) -> Any:
    """Skip the data-parallel gradient reduction on all but the last micro-batch."""
    if cfg.dp == 1:
        return contextlib.nullcontext()
    # FSDP2 and composable DDP alike: reduce only after the last micro-batch.
    model.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def _loss_parallel(cfg: TrainConfig) -> Any:
    """torch's loss_parallel context when the logits stay sharded over the vocabulary."""
    if cfg.loss_parallel and cfg.tp > 1 and cfg.pp == 1:
        return loss_parallel()
    return contextlib.nullcontext()


def _maybe_fail(ctx: Any, cfg: TrainConfig, done: int, where: str) -> bool:
    """Fault injection: fail now (raise or SIGKILL) when ``done`` steps are done, or, for
    ``where="save"``, say whether to SIGKILL inside the save of that step."""
    if not (ctx.rank == cfg.fail_rank and done == cfg.fail_at_step and cfg.attempt == 0):
        return False
    if where == "save":
        return cfg.fail_how == "kill-in-save"
    if cfg.fail_how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg.fail_how == "raise":
        raise RuntimeError(f"fault injected on rank {ctx.rank} at step {done}")
    return False


def _checkpointing(ctx: Any, cfg: TrainConfig, modules: list[Any], opt: Any, sched: Any,
                   losses: list[float], norms: list[float]) -> tuple[Any, int]:
    """The rank's Checkpointer (None without ``checkpoint_dir``) and the step to start at:
    0, or the resumed checkpoint's, with the model, optimizer, scheduler and RNGs loaded
    from it and its loss and gradient-norm history put in ``losses`` and ``norms``."""
    if not (cfg.checkpoint_dir or cfg.resume_from):
        return None, 0
    meta = {"shape": shape_record(cfg.shape),
            "layout": {"dp": cfg.dp, "tp": cfg.tp, "pp": cfg.pp,
                       "virtual_stages": cfg.virtual_stages, "dp_mode": cfg.dp_mode,
                       "sp": cfg.sp, "schedule": cfg.schedule, "dtype": cfg.dtype},
            "data": {"fingerprint": cfg.data_id, "seed": cfg.seed,
                     "global_batch": cfg.global_batch, "seq": cfg.seq}}
    ckpt = Checkpointer(cfg.checkpoint_dir or cfg.resume_from, modules, opt, sched,
                        rank=ctx.rank, world=cfg.world, keep=cfg.keep,
                        async_save=cfg.async_save, meta=meta, timeout_s=ctx.timeout_s)
    if not cfg.resume_from:
        return ckpt, 0
    doc = read_manifest(cfg.resume_from)  # files verified before any rank began
    ckpt.load(cfg.resume_from, doc)
    losses.extend(doc["history"]["losses"])
    norms.extend(doc["history"]["grad_norms"])
    if not cfg.checkpoint_dir:
        ckpt = None
    return ckpt, int(doc["step"])


def train_rank(ctx: Any, cfg: TrainConfig) -> dict[str, Any]:
    """One rank of the job (run by :func:`shardlab.distributed.launch.launch` or torchrun)."""
    device_type = "cuda" if ctx.device.startswith("cuda") else "cpu"
    mesh = init_device_mesh(device_type, (cfg.pp, cfg.dp, cfg.tp),
                            mesh_dim_names=("pp", "dp", "tp"))
    dp_rank, pp_rank = mesh["dp"].get_local_rank(), mesh["pp"].get_local_rank()
    torch.manual_seed(cfg.seed)
    model = TransformerLM(cfg.shape, seed=cfg.seed)
    if cfg.init_from:  # before any layout: every rank loads the same whole model
        load_initial_weights(model, cfg.init_from)
    fsdp_bf16 = cfg.dtype == "bf16" and cfg.dp > 1 and cfg.dp_mode != "ddp"
    # In a pipeline FSDP keeps the gathered weights from the first micro-batch's forward to
    # the last one's backward (torchtitan's default reshard_after_forward policy for pp):
    # resharding after every forward would gather them again for each micro-batch.
    dp_mode = "fsdp-zero2" if cfg.pp > 1 and cfg.dp_mode == "fsdp" else cfg.dp_mode
    options = {"tp": cfg.tp, "dp": cfg.dp, "dp_mode": dp_mode, "sp": cfg.sp,
               "loss_parallel": cfg.loss_parallel and cfg.pp == 1, "ac": cfg.recompute,
               "param_dtype": torch.bfloat16 if fsdp_bf16 else None}
    holder: dict[str, Any] = {"scale": 1.0}
    if cfg.pp > 1:
        owned = split_model(model, cfg.pp, cfg.virtual_stages, group=mesh["pp"].get_group())
        modules, stages = [], []
        for index, module in owned:
            parallelize(module, mesh, **options)
            modules.append(module)
            stages.append(PipelineStage(module, index, cfg.pp * cfg.virtual_stages, ctx.device,
                                        group=mesh["pp"].get_group()))

        def loss_fn(logits: Any, targets: Any) -> Any:
            saved = holder.get("saved")  # the measured step counts what the loss keeps too
            with saved.count() if saved is not None else contextlib.nullcontext():
                return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                                       ignore_index=-100, reduction="sum") * holder["scale"]

        schedule = build_schedule(cfg.schedule, stages, cfg.microbatches, loss_fn)
        first = any(i == 0 for i, _ in owned)
        last = any(i == cfg.pp * cfg.virtual_stages - 1 for i, _ in owned)
    else:
        parallelize(model, mesh, **options)
        modules = [model]
    params = [p for m in modules for p in m.parameters()]
    # The last stage's copy of a tied embedding: its gradient is the first stage's again.
    copies = tuple(m.tied_weight() for m in modules
                   if getattr(m, "holds_tied_copy", False) and not m.is_first)
    opt, sched = make_optimizer(params, cfg)
    stream = batches(cfg.docs, cfg.global_batch, cfg.seq, seed=cfg.seed)
    log = Path(cfg.log_dir, "train.jsonl") if cfg.log_dir and ctx.rank == 0 else None
    losses, norms, seconds = [], [], []
    flops: dict[str, int] = {}
    comm: dict[str, Any] = {}
    activation_bytes = None
    dims = {name: tuple(dist.get_process_group_ranks(mesh[name].get_group()))
            for name in ("dp", "tp", "pp") if mesh[name].size() > 1}
    autocast = bf16_autocast(cfg) if cfg.dtype == "bf16" and not fsdp_bf16 else None
    ckpt, first_step = _checkpointing(ctx, cfg, modules, opt, sched, losses, norms)
    for _ in range(first_step):  # the data position: the stream is a function of the seed
        next(stream)
    # The step measured (FLOPs, bytes sent, saved activations): the third of this run when
    # it has one, past FSDP's lazy init (step 0) and DDP's bucket rebuild (step 1).
    probe = min(first_step + 2, cfg.steps - 1)
    held, non_finite = None, None
    for step in range(first_step, cfg.steps):
        _maybe_fail(ctx, cfg, step, "step")
        batch = next(stream)
        share = batch.split(cfg.dp)[dp_rank]
        # Each rank's token-loss sum over the global real tokens, x dp: DDP and FSDP average.
        holder["scale"] = cfg.dp / batch.real_tokens
        counter = flop_counter() if step == probe else contextlib.nullcontext()
        meter = CommMeter(dims) if step == probe else contextlib.nullcontext()
        dist.barrier()
        start = time.perf_counter()
        with counter, meter, (autocast or contextlib.nullcontext()):
            local = 0.0
            if cfg.pp > 1:
                # What this rank's stages keep for backward, per micro-batch (all its chunks).
                saved = SavedBytesMeter().attach(modules) if step == probe else None
                holder["saved"] = saved
                out = pipeline_step(schedule, share, first, last)
                if saved is not None:
                    saved.detach()
                    holder["saved"] = None
                    activation_bytes = saved.total // cfg.microbatches
                local = float(out) / holder["scale"] if out is not None else 0.0
                sync_tied_grads(modules, mesh["pp"].get_group())
            else:
                micro = share.split(cfg.microbatches)
                for i, mb in enumerate(micro):
                    with _no_sync(model, cfg, sync=i == len(micro) - 1), _loss_parallel(cfg):
                        def forward(mb: Any = mb) -> Any:
                            logits = model(mb.input_ids, mb.pad_mask)
                            return lm_loss_sum_any(logits, mb.targets, mb.loss_mask)

                        if step == probe and i == 0:  # what one micro-batch keeps for backward
                            loss, activation_bytes = saved_activation_bytes(forward)
                        else:
                            loss = forward()
                        (loss * holder["scale"]).backward()
                    value = loss.detach()
                    local += float(value.full_tensor() if hasattr(value, "full_tensor")
                                   else value)
            norm = clip_grad_norm(params, cfg.clip, mesh["pp"].get_group() if cfg.pp > 1
                                  else None, copies=copies)
            opt.step()
            sched.step()
            if step == cfg.steps - 1:  # what a rank holds at the step's peak: grads included
                held = state_bytes(torch.nn.ModuleList(modules), opt)
            opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if step == probe:
            flops = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
            comm = meter.summary()
        total = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(total, group=mesh["dp"].get_group())
        if cfg.pp > 1:  # only the last stage has a loss; everyone learns it
            dist.all_reduce(total, group=mesh["pp"].get_group())
        loss_value = float(total) / batch.real_tokens
        losses.append(loss_value)
        norms.append(norm)
        seconds.append(elapsed)
        if log is not None:
            _log(log, StepLog(step, loss_value, norm, sched.get_last_lr()[0], elapsed,
                              cfg.global_batch * cfg.seq, batch.real_tokens))
        if not (math.isfinite(loss_value) and math.isfinite(norm)):
            # Both are global (all-reduced, or the same on every rank), so every rank stops
            # here together: no collective is left waiting, and no checkpoint of a
            # diverged model is written.
            non_finite = {"step": step, "loss": loss_value, "grad_norm": norm}
            break
        if ckpt is not None and (step + 1 == cfg.steps or (
                cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0)):
            ckpt.save(step + 1, {"losses": losses, "grad_norms": norms},
                      kill_before_rename=_maybe_fail(ctx, cfg, step + 1, "save"))
    if ckpt is not None:
        ckpt.finish()
    return {"rank": ctx.rank, "dp_rank": dp_rank, "pp_rank": pp_rank,
            "resumed_at": first_step, "checkpoint_seconds": ckpt.seconds if ckpt else [],
            "tp_rank": mesh["tp"].get_local_rank(), "losses": losses, "grad_norms": norms,
            "step_seconds": seconds, "flops_by_op": flops,
            "activation_bytes": activation_bytes, "comm_step": comm, "measured_step": probe,
            "cuda_peak_allocated": (torch.cuda.max_memory_allocated()
                                    if device_type == "cuda" else None),
            "state_bytes": held, "non_finite": non_finite}
