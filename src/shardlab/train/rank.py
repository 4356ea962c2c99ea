"""One rank's program, shared by ``shardlab train`` and ``shardlab dryrun``.

:func:`build_rank` lays the model out for this rank of a ``(pp, dp, tp)`` mesh (``(pp,
edp, ep, tp)`` with expert parallelism, ``(pp, dp_replicate, dp_shard, cp, tp)`` with
context parallelism or HSDP, :mod:`shardlab.distributed.mesh`): the pipeline stage cut
(even, or by ``stage_layers``), then tensor parallel, expert parallel, context parallel's
K/V gather, activation checkpointing and FSDP2 (over dp x cp; hybrid over a 2-D mesh with
``dp_replicate``) or DDP
(torchtitan's order, :func:`shardlab.distributed.parallelize.parallelize`), the AdamW
optimizer and, in a pipeline, the schedule. :func:`train_step` runs one optimizer step
on this rank's share of a batch (with context parallelism, its cp rank's tokens of it:
:func:`shardlab.distributed.context_parallel.shard_sequence`): its micro-batches
(gradient accumulation, or the pipeline schedule), clipping by the whole model's gradient
norm, AdamW and the learning-rate schedule.

The real loop (:mod:`shardlab.train.loop`) calls them with a real process group and
real tensors; the dry run (:mod:`shardlab.dryrun`) calls them with torch's fake process
group, the model built on the meta device and materialised as fake tensors
(``materialize``). Neither function reads a tensor's value (no ``.item()``), so both
run unchanged on fake tensors: the dry run measures the program ``train`` runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor.parallel import loss_parallel

from shardlab.distributed.context_parallel import shard_sequence
from shardlab.distributed.mesh import RunMesh, make_mesh
from shardlab.distributed.parallelize import parallelize
from shardlab.distributed.pipeline import (
    build_schedule,
    pipeline_step,
    split_model,
    stage_io_meta,
)
from shardlab.distributed.saved import SavedBytesMeter, saved_activation_bytes
from shardlab.distributed.tensor_parallel import lm_loss_sum_any
from shardlab.distributed.tied_embedding import sync_tied_grads
from shardlab.nn.data import Batch
from shardlab.nn.model import TransformerLM
from shardlab.nn.moe import MoEOptions
from shardlab.train.config import TrainConfig, bf16_compute, fsdp_mixed_precision, loss_split
from shardlab.train.fp8 import convert_fp8_linears, refresh_fp8_scales
from shardlab.train.optimizer import clip_grad_norm, make_optimizer


def bf16_autocast(cfg: TrainConfig, device_type: str) -> Any:
    """``torch.autocast(device_type, bfloat16)`` when the run computes in bf16 (bf16, and
    fp8 outside its fp8 matmuls); else a null context. The device type must be the ranks'
    own: an autocast for "cpu" leaves a CUDA rank's matmuls in fp32 (autocast acts on its
    own device type's operators only)."""
    if bf16_compute(cfg):
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class RankProgram:
    """What :func:`build_rank` made for this rank: the mesh, the modules it owns (the
    whole model, or its pipeline stages), the optimizer and its schedule, the pipeline
    schedule (None without a pipeline), and the flags a step needs."""

    cfg: TrainConfig
    mesh: RunMesh
    modules: list[Any]
    params: list[Any]
    copies: tuple[Any, ...]
    opt: Any
    sched: Any
    schedule: Any = None
    first: bool = True
    last: bool = True
    holder: dict[str, Any] = field(default_factory=lambda: {"scale": 1.0})

    @property
    def dp_rank(self) -> int:
        """This rank's index in the data-parallel group."""
        return self.mesh["dp"].get_local_rank()

    @property
    def pp_rank(self) -> int:
        """This rank's pipeline rank."""
        return self.mesh["pp"].get_local_rank()

    @property
    def ep_rank(self) -> int:
        """This rank's index in its expert-parallel group (0 without one)."""
        return self.mesh["ep"].get_local_rank() if self.cfg.ep > 1 else 0

    @property
    def cp_rank(self) -> int:
        """This rank's index in its context-parallel group (0 without one)."""
        return self.mesh["cp"].get_local_rank() if self.cfg.cp > 1 else 0

    def groups(self) -> dict[str, Any]:
        """The process group of each mesh dim the comm meter files bytes under (those with
        more than one rank). ``dp`` is the group FSDP or DDP reduces over: dp x cp with
        context parallelism (FSDP's shard group ``dp_shard_cp`` under HSDP, whose
        all-reduce across replicas is ``dp_replicate``); ``cp`` carries the K/V gathers."""
        cfg, mesh = self.cfg, self.mesh
        if cfg.cp == 1 and cfg.dp_replicate == 1:
            named = {name: mesh[name] for name in ("dp", "tp", "pp")}
            if cfg.ep > 1:
                named |= {"ep": mesh["ep"], "edp": mesh["edp"]}
        else:
            named = {"dp": mesh["dp_shard_cp"], "dp_replicate": mesh["dp_replicate"],
                     "cp": mesh["cp"], "tp": mesh["tp"], "pp": mesh["pp"]}
            if cfg.ep > 1:  # the experts' shard group: (dp_shard/ep)·cp ranks (mesh.py)
                named |= {"ep": mesh["ep"], "edp": mesh["edp"]}
        groups = {name: m.get_group() for name, m in named.items() if m.size() > 1}
        if "cp" in groups:  # the K/V gathers' own group (mesh.py)
            groups["cp"] = mesh.cp_group
        return groups

    def dims(self) -> dict[str, tuple[int, ...]]:
        """Global ranks of each mesh dim with more than one rank (the comm meter's names)."""
        return {name: tuple(dist.get_process_group_ranks(group))
                for name, group in self.groups().items()}

    def meter_groups(self) -> dict[str, str]:
        """Process-group name -> mesh dim, for the comm meter to tell apart two dims of the
        same ranks: context parallel's K/V gathers run on a group of their own, which
        shares its ranks with FSDP's dp x cp group when dp = 1 (empty without cp: there
        the meter tells dims of the same ranks apart by the collective's kind)."""
        groups = self.groups()
        if self.cfg.cp == 1:
            return {}
        # (the experts' shard group too: its ranks are the cp group's where dp_shard = ep)
        return {groups[name].group_name: name for name in ("dp", "cp", "edp")
                if name in groups}


def moe_options(cfg: TrainConfig, groups: int) -> MoEOptions:
    """The MoE layers' options for a model whose every forward sees one of ``groups`` equal
    token groups of a step: the auxiliary losses' weights divided by ``groups``, so the
    objective is the LM loss plus the mean over the step's forwards of each forward's
    auxiliary loss (Megatron-LM scales them by 1/micro-batches and averages over dp).

    A rank's forwards are its micro-batches (``groups = microbatches``); FSDP's average
    over dp divides by dp. The one-process reference runs all dp x microbatches groups
    (:mod:`shardlab.train.reference`)."""
    return MoEOptions(aux_coef=cfg.aux_coef / groups, z_coef=cfg.z_coef / groups,
                      capacity_factor=cfg.capacity_factor, routing=cfg.routing)


def build_rank(cfg: TrainConfig, device: str, *, meta: bool = False,
               materialize: Callable[[list[Any]], None] | None = None,
               force_sum: bool | None = None,
               weights: Callable[[Any], None] | None = None) -> RankProgram:
    """This rank's laid-out model, optimizer and pipeline schedule (the default process
    group must be up, with ``cfg.world`` ranks).

    ``meta``: build the model on the meta device (no memory, no init values), lay it out
    there, then call ``materialize(modules)`` (the dry run's ``to_empty`` under
    ``FakeTensorMode``) before the optimizer is made. ``force_sum``: FSDP2's AVG-as-sum
    workaround (None probes the backend; the dry run's fake group has no arithmetic to
    probe). ``weights(model)``: loads initial weights into the whole model before it is
    laid out (``--init-from``).
    """
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    mesh = make_mesh(device_type, cfg.pp, cfg.dp, cfg.tp, cfg.ep, experts=cfg.etp > 1,
                     cp=cfg.cp, dp_replicate=cfg.dp_replicate)
    torch.manual_seed(cfg.seed)
    with torch.device("meta") if meta else contextlib.nullcontext():
        model = TransformerLM(cfg.shape, seed=cfg.seed,
                              moe_options=moe_options(cfg, cfg.microbatches))
    if weights is not None:  # before any layout: every rank loads the same whole model
        weights(model)
    if cfg.dtype == "fp8":  # torchao's Float8Linear in place of nn.Linear, before any layout
        convert_fp8_linears(model, all_gather=cfg.fp8_all_gather, tp=cfg.tp)
    fsdp_bf16 = fsdp_mixed_precision(cfg)
    # In a pipeline FSDP keeps the gathered weights from the first micro-batch's forward to
    # the last one's backward (torchtitan's default reshard_after_forward policy for pp):
    # resharding after every forward would gather them again for each micro-batch.
    dp_mode = "fsdp-zero2" if cfg.pp > 1 and cfg.dp_mode == "fsdp" else cfg.dp_mode
    options = {"tp": cfg.tp, "dp": cfg.dp, "dp_mode": dp_mode, "sp": cfg.sp,
               "loss_parallel": loss_split(cfg), "ac": cfg.recompute,
               "param_dtype": torch.bfloat16 if fsdp_bf16 else None, "force_sum": force_sum,
               "ep": cfg.ep, "etp": cfg.etp, "cp": cfg.cp, "dp_replicate": cfg.dp_replicate}
    if cfg.pp == 1:
        parallelize(model, mesh, **options)
        if materialize is not None:
            materialize([model])
        params = list(model.parameters())
        opt, sched = make_optimizer(params, cfg)
        return RankProgram(cfg, mesh, [model], params, (), opt, sched)
    group = mesh["pp"].get_group()
    owned = split_model(model, cfg.pp, cfg.virtual_stages, group=group,
                        stage_layers=cfg.stage_layers)
    del model  # the stages hold deep copies of their parts
    modules = [module for _, module in owned]
    for module in modules:
        parallelize(module, mesh, **options)
    if materialize is not None:
        materialize(modules)
    stages = []
    share = cfg.global_batch // cfg.dp
    for index, module in owned:
        # Static shapes: no run-time shape inference, which would exchange tensor
        # metadata with the neighbouring stages before the first step.
        inputs, outputs = stage_io_meta(module, share // cfg.microbatches, cfg.seq,
                                        tp=cfg.tp, sp=cfg.sp,
                                        dtype=torch.bfloat16 if fsdp_bf16 else None,
                                        autocast_bf16=bf16_compute(cfg) and not fsdp_bf16,
                                        cp=cfg.cp)
        stages.append(PipelineStage(module, index, cfg.pp * cfg.virtual_stages, device,
                                    input_args=inputs, output_args=outputs, group=group))
    params = [p for m in modules for p in m.parameters()]
    # The last stage's copy of a tied embedding: its gradient is the first stage's again.
    copies = tuple(m.tied_weight() for m in modules if m.holds_tied_copy and not m.is_first)
    opt, sched = make_optimizer(params, cfg)
    program = RankProgram(cfg, mesh, modules, params, copies, opt, sched,
                          first=any(i == 0 for i, _ in owned),
                          last=any(i == cfg.pp * cfg.virtual_stages - 1 for i, _ in owned))
    holder = program.holder

    def loss_fn(logits: Any, targets: Any) -> Any:
        saved = holder.get("saved")  # the measured step counts what the loss keeps too
        with saved.count() if saved is not None else contextlib.nullcontext():
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                                   ignore_index=-100, reduction="sum") * holder["scale"]

    program.schedule = build_schedule(cfg.schedule, stages, cfg.microbatches, loss_fn)
    return program


def _loss_parallel(cfg: TrainConfig) -> Any:
    """torch's loss_parallel context when the logits stay sharded over the vocabulary."""
    if cfg.loss_parallel and cfg.tp > 1 and cfg.pp == 1:
        return loss_parallel()
    return contextlib.nullcontext()


@dataclass
class StepResult:
    """One step's local loss sum (a 0-dim tensor, this rank's share; zero on pipeline
    ranks without the last stage), the whole model's gradient norm (0-dim float64
    tensor) and, when measured, the bytes one micro-batch saved for backward."""

    local_loss: torch.Tensor
    grad_norm: torch.Tensor
    activation_bytes: int | None = None


def train_step(program: RankProgram, share: Batch, real_tokens: int, *,
               measure_saved: bool = False) -> StepResult:
    """Forward and backward of this rank's micro-batches, clipping, AdamW and the
    learning-rate schedule (gradients are left for the caller to read, then zero).

    Each rank's summed token loss is scaled by ``dp·cp / real_tokens`` (``real_tokens``:
    the whole global batch's): DDP and FSDP average over dp x cp, so any layout trains the
    same model as one process. With context parallelism the rank runs its cp rank's
    tokens of ``share`` (:func:`~shardlab.distributed.context_parallel.shard_sequence`).
    ``measure_saved``: count what one micro-batch keeps for backward (saved-tensor hooks;
    real tensors only).
    """
    cfg, holder = program.cfg, program.holder
    holder["scale"] = cfg.grad_ranks / real_tokens
    activation_bytes = None
    local = torch.zeros((), dtype=torch.float64)
    if program.schedule is not None:
        # What this rank's stages keep for backward, per micro-batch (all its chunks).
        saved = SavedBytesMeter().attach(program.modules) if measure_saved else None
        holder["saved"] = saved
        tokens = shard_sequence(share, cfg.cp, program.cp_rank) if cfg.cp > 1 else share
        out = pipeline_step(program.schedule, tokens, program.first, program.last)
        if saved is not None:
            saved.detach()
            holder["saved"] = None
            activation_bytes = saved.total // cfg.microbatches
        if out is not None:
            local = out.double() / holder["scale"]
        sync_tied_grads(program.modules, program.mesh["pp"].get_group())
    else:
        model = program.modules[0]
        micro = share.split(cfg.microbatches)
        for i, mb in enumerate(micro):
            if cfg.grad_ranks > 1 and cfg.dp_mode == "ddp":
                # DDP all-reduces after the last micro-batch (its local gradients are whole
                # anyway). FSDP2 reduce-scatters after every one, as torchtitan's loop does:
                # without sync it would accumulate every parameter's gradient unsharded in
                # fp32 (4 B a parameter on each rank, 32 GB for an 8B model).
                model.set_requires_gradient_sync(i == len(micro) - 1)
            with _loss_parallel(cfg):
                def forward(mb: Batch = mb) -> Any:
                    if cfg.cp == 1:
                        logits = model(mb.input_ids, mb.pad_mask)
                        return lm_loss_sum_any(logits, mb.targets, mb.loss_mask)
                    shard = shard_sequence(mb, cfg.cp, program.cp_rank)
                    args, kwargs = shard.model_inputs()
                    return lm_loss_sum_any(model(*args, **kwargs), shard.batch.targets,
                                           shard.batch.loss_mask)

                if measure_saved and i == 0:  # what one micro-batch keeps for backward
                    loss, activation_bytes = saved_activation_bytes(forward)
                else:
                    loss = forward()
                (loss * holder["scale"]).backward()
            value = loss.detach()
            local = local + (value.full_tensor() if hasattr(value, "full_tensor")
                             else value).double()
    norm = clip_grad_norm(program.params, cfg.clip,
                          program.mesh["pp"].get_group() if cfg.pp > 1 else None,
                          copies=program.copies)
    program.opt.step()
    if cfg.fp8_all_gather:  # the next forward's fp8 gathers take the updated scales
        refresh_fp8_scales(program.modules)
    program.sched.step()
    return StepResult(local, norm, activation_bytes)
