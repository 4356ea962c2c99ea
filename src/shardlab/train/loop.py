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
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shardlab.config.model import ModelShape
from shardlab.errors import SpecError

DP_MODES = ("fsdp", "fsdp-zero2", "ddp")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
FAIL_HOW = ("raise", "kill", "kill-in-save")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs, validated by :func:`check_config` before any rank starts."""

    shape: ModelShape
    dp: int = 1
    tp: int = 1
    pp: int = 1
    virtual_stages: int = 1
    dp_mode: str = "fsdp"
    sp: bool = False
    loss_parallel: bool = False
    recompute: str = "none"
    schedule: str = "1f1b"
    global_batch: int = 8
    micro_batch: int = 0  # 0: the whole dp share at once (no accumulation)
    seq: int = 32
    steps: int = 20
    lr: float = 3e-3
    warmup: int = 2
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    dtype: str = "fp32"
    seed: int = 0
    log_dir: str = ""
    # Fault injection (tests): rank ``fail_rank`` fails once ``fail_at_step`` steps are
    # done, by raising, by SIGKILL, or by SIGKILL in the middle of that step's save; only
    # on the first attempt, so a restarted job (``--max-restarts``) gets past it.
    fail_at_step: int = -1
    fail_rank: int = -1
    fail_how: str = "raise"
    attempt: int = 0
    # Checkpoints (shardlab.distributed.checkpoint): every K steps and after the last one.
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    keep: int = 3
    async_save: bool = False
    resume_from: str = ""  # a checkpoint folder, verified before any rank starts
    init_from: str = ""  # safetensors weights in shardlab's names (``shardlab import``)
    data_id: str = ""  # the corpus's fingerprint, recorded with the data position
    docs: list[list[int]] = field(default_factory=list, compare=False, repr=False)

    @property
    def world(self) -> int:
        """Ranks: dp * tp * pp."""
        return self.dp * self.tp * self.pp

    @property
    def microbatches(self) -> int:
        """Micro-batches per data-parallel rank and step."""
        share = self.global_batch // self.dp
        return share // (self.micro_batch or share)


def check_config(cfg: TrainConfig) -> None:
    """Every constraint the mesh and the model impose, as one-line SpecErrors."""
    from shardlab.config.layout import make_layout

    if cfg.dp_mode not in DP_MODES:
        raise SpecError("dp_mode", cfg.dp_mode, f"must be one of {', '.join(DP_MODES)}")
    if cfg.pp > 1 and cfg.schedule not in PP_SCHEDULES:
        raise SpecError("schedule", cfg.schedule, f"must be one of {', '.join(PP_SCHEDULES)}")
    if cfg.dtype not in ("fp32", "bf16"):
        raise SpecError("dtype", cfg.dtype, "must be fp32 or bf16")
    if cfg.global_batch % cfg.dp:
        raise SpecError("global_batch", cfg.global_batch, f"must be a multiple of dp ({cfg.dp})")
    share = cfg.global_batch // cfg.dp
    if cfg.micro_batch and share % cfg.micro_batch:
        raise SpecError("micro_batch", cfg.micro_batch,
                        f"must divide each data-parallel rank's {share} sequences")
    if cfg.shape.tied and cfg.pp > 1 and cfg.tp > 1:
        raise SpecError("tp", cfg.tp, "with a tied head split over pipeline stages is not "
                        "supported yet; untie the head (llama style) or use tp=1")
    if cfg.pp > 1:  # torch.distributed.pipelining's own limits, checked before any rank
        m, stages = cfg.microbatches, cfg.pp * cfg.virtual_stages
        if cfg.schedule == "1f1b" and m < cfg.pp:
            raise SpecError("micro_batch", cfg.micro_batch, f"gives {m} micro-batches; 1f1b "
                            f"needs at least pp={cfg.pp} (use a smaller --micro-batch)")
        if cfg.schedule == "interleaved-1f1b" and m % cfg.pp:
            raise SpecError("micro_batch", cfg.micro_batch, f"gives {m} micro-batches; "
                            f"interleaved-1f1b needs a multiple of pp={cfg.pp}")
        if cfg.schedule != "interleaved-1f1b" and stages != cfg.pp:
            raise SpecError("schedule", cfg.schedule, "runs one stage per rank; use "
                            "interleaved-1f1b with --virtual-stages > 1")
        if cfg.schedule == "interleaved-1f1b" and stages == cfg.pp:
            raise SpecError("virtual_stages", cfg.virtual_stages,
                            "must be >= 2 for interleaved-1f1b")
    if cfg.dp_mode == "ddp" and cfg.dp > 1 and cfg.pp > 1:
        raise SpecError("dp_mode", "ddp", "cannot run inside a pipeline (the schedule cannot "
                        "defer composable DDP's all-reduce to the last micro-batch, as "
                        "torchtitan refuses DDP with more than one mesh dim); use fsdp")
    if cfg.dp_mode == "ddp" and cfg.tp > 1:
        raise SpecError("dp_mode", "ddp", "cannot hold tensor-parallel (DTensor) parameters; "
                        "use fsdp with tp > 1")
    for name, value in (("steps", cfg.steps), ("seq", cfg.seq)):
        if value < 1:
            raise SpecError(name, value, "must be a positive integer")
    if cfg.fail_how not in FAIL_HOW:
        raise SpecError("fail_how", cfg.fail_how, f"must be one of {', '.join(FAIL_HOW)}")
    if cfg.fail_how == "kill-in-save" and (cfg.async_save or not cfg.checkpoint_dir):
        raise SpecError("fail_how", cfg.fail_how, "needs a synchronous --checkpoint-dir")
    make_layout(cfg.shape, dp=cfg.dp, tp=cfg.tp, pp=cfg.pp, virtual_stages=cfg.virtual_stages,
                sp=cfg.sp, micro_batch=cfg.micro_batch or share, global_batch=cfg.global_batch,
                seq=cfg.seq, recompute=cfg.recompute,
                dtype="amp-bf16" if cfg.dtype == "bf16" else "fp32",
                schedule=cfg.schedule if cfg.pp > 1 else None)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine down to ``min_lr_ratio``
    at the last step (Loshchilov & Hutter 2017, as in nanoGPT and torchtitan)."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def token_loss_sum(logits: Any, batch: Any) -> Any:
    """Summed next-token cross-entropy over real tokens (padding targets ignored); works on
    a vocabulary-sharded DTensor under ``loss_parallel``."""
    import torch.nn.functional as F

    from shardlab.distributed.pipeline import masked_targets

    return F.cross_entropy(logits.flatten(0, 1), masked_targets(batch).flatten(),
                           ignore_index=-100, reduction="sum")


def make_optimizer(params: list[Any], cfg: TrainConfig) -> tuple[Any, Any]:
    """AdamW (single-tensor path: the same arithmetic on shards and whole tensors) and its
    warm-up + cosine schedule."""
    import torch

    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=cfg.weight_decay, foreach=False)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))


def clip_grad_norm(params: list[Any], max_norm: float, pp_group: Any = None,
                   copies: tuple[Any, ...] = ()) -> float:
    """Clip by the norm of the gradient of the *whole* model (torchtitan's clip_grad_norm_).

    Squares of every rank's local gradient elements are summed in float64 per sharding:
    plain tensors and DTensor dims that are ``Replicate`` hold the same numbers on every
    rank of that dim, so only the dims that split the elements (``Shard``, FSDP's
    ``_StridedShard``) are summed over, by one scalar all-reduce per group of such dims,
    then over the pipeline stages. Those scalars are filed as ``grad_norm`` by the comm meter.
    ``copies``: parameters whose gradient another stage holds too (the last stage's copy of
    a tied embedding, equal to the first's after ``sync_tied_grads``): clipped, but counted
    once in the norm.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from shardlab.distributed.measure import comm_label

    grads = [p.grad for p in params if p.grad is not None]
    skip = {id(p.grad) for p in copies if p.grad is not None}
    squares: dict[tuple[str, ...], Any] = {}
    groups: dict[tuple[str, ...], list[Any]] = {}
    for g in grads:  # FSDP/TP shards (DTensor) and replicated plain tensors side by side
        if id(g) in skip:
            continue
        local, key = g.detach(), ()
        if isinstance(local, DTensor):
            # Every dim but Replicate splits the elements (FSDP over a TP shard of the
            # same tensor dim is _StridedShard, which is_shard() does not report).
            mesh, dims = local.device_mesh, [i for i, p in enumerate(local.placements)
                                             if not p.is_replicate()]
            key = tuple(mesh.get_group(i).group_name for i in dims)
            groups[key] = [mesh.get_group(i) for i in dims]
            local = local.to_local()
        square = local.double().pow(2).sum()
        squares[key] = squares[key] + square if key in squares else square
    total_sq = torch.zeros((), dtype=torch.float64)
    with comm_label("grad_norm"):
        for key, value in sorted(squares.items()):
            for group in groups.get(key, []):
                dist.all_reduce(value, group=group)
            total_sq += value
        if pp_group is not None:
            dist.all_reduce(total_sq, group=pp_group)
    total = float(total_sq.sqrt())
    coef = min(1.0, max_norm / (total + 1e-6))
    if coef < 1.0:
        for g in grads:
            g.detach().mul_(coef)
    return total


def reference_run(cfg: TrainConfig) -> list[float]:
    """The same model, data, optimizer and clipping on one process: the parity reference."""
    import torch

    from shardlab.nn.data import batches
    from shardlab.nn.model import TransformerLM

    torch.manual_seed(cfg.seed)
    model = TransformerLM(cfg.shape, seed=cfg.seed)
    if cfg.init_from:
        load_initial_weights(model, cfg.init_from)
    opt, sched = make_optimizer(list(model.parameters()), cfg)
    stream = batches(cfg.docs, cfg.global_batch, cfg.seq, seed=cfg.seed)
    losses = []
    for _ in range(cfg.steps):
        batch = next(stream)
        with _autocast(cfg):
            loss = token_loss_sum(model(batch.input_ids, batch.pad_mask), batch)
        (loss / batch.real_tokens).backward()
        clip_grad_norm(list(model.parameters()), cfg.clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()) / batch.real_tokens)
    return losses


def load_initial_weights(model: Any, path: str) -> None:
    """Every parameter of the (not yet laid out) model from a safetensors file in
    shardlab's names (what ``shardlab import`` writes); strict: all names, all shapes."""
    from shardlab.hf.weights import read_weights

    model.load_state_dict(read_weights(path), strict=True)


def _autocast(cfg: TrainConfig) -> Any:
    import torch

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
    import json

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
        from torch.distributed.tensor.parallel import loss_parallel

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
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if cfg.fail_how == "raise":
        raise RuntimeError(f"fault injected on rank {ctx.rank} at step {done}")
    return False


def _checkpointing(ctx: Any, cfg: TrainConfig, modules: list[Any], opt: Any, sched: Any,
                   losses: list[float], norms: list[float]) -> tuple[Any, int]:
    """The rank's Checkpointer (None without ``checkpoint_dir``) and the step to start at:
    0, or the resumed checkpoint's, with the model, optimizer, scheduler and RNGs loaded
    from it and its loss and gradient-norm history put in ``losses`` and ``norms``."""
    from shardlab.distributed import checkpoint

    if not (cfg.checkpoint_dir or cfg.resume_from):
        return None, 0
    meta = {"shape": checkpoint.shape_record(cfg.shape),
            "layout": {"dp": cfg.dp, "tp": cfg.tp, "pp": cfg.pp,
                       "virtual_stages": cfg.virtual_stages, "dp_mode": cfg.dp_mode,
                       "sp": cfg.sp, "schedule": cfg.schedule, "dtype": cfg.dtype},
            "data": {"fingerprint": cfg.data_id, "seed": cfg.seed,
                     "global_batch": cfg.global_batch, "seq": cfg.seq}}
    ckpt = checkpoint.Checkpointer(cfg.checkpoint_dir or cfg.resume_from, modules, opt, sched,
                                   rank=ctx.rank, world=cfg.world, keep=cfg.keep,
                                   async_save=cfg.async_save, meta=meta,
                                   timeout_s=ctx.timeout_s)
    if not cfg.resume_from:
        return ckpt, 0
    doc = checkpoint.read_manifest(cfg.resume_from)  # files verified before any rank began
    ckpt.load(cfg.resume_from, doc)
    losses.extend(doc["history"]["losses"])
    norms.extend(doc["history"]["grad_norms"])
    if not cfg.checkpoint_dir:
        ckpt = None
    return ckpt, int(doc["step"])


def train_rank(ctx: Any, cfg: TrainConfig) -> dict[str, Any]:
    """One rank of the job (run by :func:`shardlab.distributed.launch.launch` or torchrun)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from shardlab.distributed.measure import (
        CommMeter,
        SavedBytesMeter,
        flop_counter,
        saved_activation_bytes,
    )
    from shardlab.distributed.parallelize import lm_loss_sum_any, parallelize, state_bytes
    from shardlab.nn.data import batches
    from shardlab.nn.model import TransformerLM

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
        from torch.distributed.pipelining import PipelineStage

        from shardlab.distributed.pipeline import (
            build_schedule,
            pipeline_step,
            split_model,
            sync_tied_grads,
        )

        owned = split_model(model, cfg.pp, cfg.virtual_stages, group=mesh["pp"].get_group())
        modules, stages = [], []
        for index, module in owned:
            parallelize(module, mesh, **options)
            modules.append(module)
            stages.append(PipelineStage(module, index, cfg.pp * cfg.virtual_stages, ctx.device,
                                        group=mesh["pp"].get_group()))

        def loss_fn(logits: Any, targets: Any) -> Any:
            import torch.nn.functional as F

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
    autocast = _autocast(cfg) if cfg.dtype == "bf16" and not fsdp_bf16 else None
    ckpt, first_step = _checkpointing(ctx, cfg, modules, opt, sched, losses, norms)
    for _ in range(first_step):  # the data position: the stream is a function of the seed
        next(stream)
    # The step measured (FLOPs, bytes sent, saved activations): the third of this run when
    # it has one, past FSDP's lazy init (step 0) and DDP's bucket rebuild (step 1).
    probe = min(first_step + 2, cfg.steps - 1)
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
            "state_bytes": held}
