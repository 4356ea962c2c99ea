"""Real training on a device mesh: ``shardlab train`` and ``python -m shardlab.train``.

One rank's loop, top to bottom: build the LM from its ModelShape with a fixed seed
(every rank the same), lay it out on a ``(pp, dp, tp)`` device mesh (pipeline stages,
then tensor parallel, a mixture of experts' expert parallel over ``ep`` ranks drawn
from dp, activation checkpointing and FSDP2 or DDP, in torchtitan's order), and per
step: take this data-parallel rank's share of the global batch,
run its micro-batches (gradient accumulation, or the pipeline schedule), clip the
gradient norm over the whole sharded model, AdamW with warm-up and cosine decay.
Each rank's summed token loss is divided by the real tokens of the *whole* global
batch (x dp, because DDP and FSDP average over dp), so any layout trains the same
model as one process on the same batches (``--check-parity`` shows it).

The run's description and its checks are :mod:`shardlab.train.config`, the rank's
program (layout and one step, shared with ``shardlab dryrun``) :mod:`shardlab.train.rank`,
the update (AdamW, its schedule, clipping) :mod:`shardlab.train.optimizer`, and the
one-process parity reference :mod:`shardlab.train.reference`.
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

from shardlab.distributed.checkpoint import Checkpointer
from shardlab.distributed.checkpoint_manifest import read_manifest, shape_record
from shardlab.distributed.expert_parallel import RoutingRecorder
from shardlab.distributed.measure import CommMeter, flop_counter, state_bytes
from shardlab.hf.weights import read_weights
from shardlab.nn.data import batches
from shardlab.train.config import TrainConfig, fsdp_mixed_precision
from shardlab.train.fp8 import refresh_fp8_scales
from shardlab.train.rank import bf16_autocast, build_rank, train_step
from shardlab.train.tensorboard import RunBoard


def load_initial_weights(model: Any, path: str) -> None:
    """Every parameter of the (not yet laid out) model from a safetensors file in
    shardlab's names (what ``shardlab import`` writes); strict: all names, all shapes."""
    model.load_state_dict(read_weights(path), strict=True)


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
                       "sp": cfg.sp, "schedule": cfg.schedule, "dtype": cfg.dtype,
                       "ep": cfg.ep, "etp": cfg.etp, "capacity_factor": cfg.capacity_factor,
                       "cp": cfg.cp, "stage_layers": list(cfg.stage_layers),
                       "dp_replicate": cfg.dp_replicate},
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
    program = build_rank(cfg, ctx.device, weights=(
        (lambda model: load_initial_weights(model, cfg.init_from)) if cfg.init_from else None))
    mesh, modules, opt, sched = program.mesh, program.modules, program.opt, program.sched
    dp_rank, pp_rank = program.dp_rank, program.pp_rank
    stream = batches(cfg.docs, cfg.global_batch, cfg.seq, seed=cfg.seed)
    log = Path(cfg.log_dir, "train.jsonl") if cfg.log_dir and ctx.rank == 0 else None
    board = (RunBoard(cfg.tensorboard, cfg.shape, cfg.seq, cfg.peak_flops or None)
             if cfg.tensorboard and ctx.rank == 0 else None)
    losses, norms, seconds = [], [], []
    flops: dict[str, int] = {}
    comm: dict[str, Any] = {}
    activation_bytes = None
    routing: list[dict[str, Any]] = []
    dims = program.dims()
    autocast = bf16_autocast(cfg, device_type) if not fsdp_mixed_precision(cfg) else None
    ckpt, first_step = _checkpointing(ctx, cfg, modules, opt, sched, losses, norms)
    if cfg.fp8_all_gather:
        # The first fp8 gathers' scales, from the weights built or just loaded: without them
        # torchao all-reduces each weight's amax at every gather of the first step.
        refresh_fp8_scales(modules)
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
        counter = flop_counter() if step == probe else contextlib.nullcontext()
        meter = CommMeter(dims, program.meter_groups()) if step == probe \
            else contextlib.nullcontext()
        recorder = RoutingRecorder().attach(modules) if step == probe else None
        dist.barrier()
        start = time.perf_counter()
        with counter, meter, (autocast or contextlib.nullcontext()):
            result = train_step(program, share, batch.real_tokens, measure_saved=step == probe)
            if step == cfg.steps - 1:  # what a rank holds at the step's peak: grads included
                held = state_bytes(torch.nn.ModuleList(modules), opt)
            opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if step == probe:
            activation_bytes = result.activation_bytes
            flops = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
            comm = meter.summary()
        if recorder is not None:
            routing = recorder.detach()
        norm = float(result.grad_norm)
        total = result.local_loss.reshape(1).clone()
        dist.all_reduce(total, group=mesh["dp"].get_group())
        if cfg.cp > 1:  # each cp rank summed its own tokens' losses
            dist.all_reduce(total, group=mesh["cp"].get_group())
        if cfg.pp > 1:  # only the last stage has a loss; everyone learns it
            dist.all_reduce(total, group=mesh["pp"].get_group())
        loss_value = float(total) / batch.real_tokens
        losses.append(loss_value)
        norms.append(norm)
        seconds.append(elapsed)
        if log is not None:
            _log(log, StepLog(step, loss_value, norm, sched.get_last_lr()[0], elapsed,
                              cfg.global_batch * cfg.seq, batch.real_tokens))
        if board is not None:
            board.step(step, loss_value, norm, sched.get_last_lr()[0], elapsed,
                       cfg.global_batch * cfg.seq)
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
    if board is not None:
        board.close()
    return {"rank": ctx.rank, "dp_rank": dp_rank, "pp_rank": pp_rank,
            "resumed_at": first_step, "checkpoint_seconds": ckpt.seconds if ckpt else [],
            # Whether the saves did run in the background: asked for (cfg.async_save) is
            # not enough, a host short of memory saves synchronously (checkpoint_async.fits;
            # the same answer on every rank). False when nothing was saved.
            "checkpoint_async": bool(ckpt is not None and ckpt.background),
            "tp_rank": mesh["tp"].get_local_rank(), "ep_rank": program.ep_rank,
            "cp_rank": program.cp_rank,
            "routing": routing, "losses": losses, "grad_norms": norms,
            "step_seconds": seconds, "flops_by_op": flops,
            "activation_bytes": activation_bytes, "comm_step": comm, "measured_step": probe,
            "cuda_peak_allocated": (torch.cuda.max_memory_allocated()
                                    if device_type == "cuda" else None),
            "state_bytes": held, "non_finite": non_finite}
