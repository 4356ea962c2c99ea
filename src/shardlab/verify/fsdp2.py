"""FSDP2 (``fully_shard``) + AdamW on N ranks equals one process, in fp32 and in bf16 compute.

The model is a tiny llama-style :class:`shardlab.nn.model.TransformerLM` (2 layers,
d_model 32, 4 heads, the garden vocabulary, 32 tokens). Following FSDP2's documented
usage, :func:`torch.distributed.fsdp.fully_shard` is applied bottom-up: to each block of
``model.blocks`` (one all-gather / reduce-scatter group per block), then to the root
(embedding, final norm, head). The optimizer is built *after* sharding, on the sharded
parameters, so each rank's AdamW state covers only its shard.

What is checked, and why:

* **Sharding layout.** Every parameter is a :class:`torch.distributed.tensor.DTensor` with
  ``placements == (Shard(0),)`` on the 1-D mesh (FSDP2's per-parameter dim-0 sharding, as
  opposed to FSDP1's flat parameters), and rank 0 holds about ``1/world`` of the elements
  (``DTensor.to_local()`` numel over the global ``DTensor.numel()``; dim 0 sizes that the
  world does not divide make it slightly uneven).
* **Gradients after the first backward.** Each rank trains on its
  :meth:`shardlab.nn.data.Batch.split` share with the summed token loss divided by the
  *global* real-token count (:func:`shardlab.nn.data.global_token_normalizer`), so the sum
  of the ranks' gradients is the full-batch gradient. FSDP2 however *averages*: with fp32
  or bf16 ``reduce_dtype`` it reduce-scatters with ``ReduceOp.AVG``, or, with
  ``set_force_sum_reduction_for_comms(True)``, with ``ReduceOp.SUM`` followed by its own
  division by the world size. Either way the result is the mean, so each rank's loss is
  multiplied by ``world`` (a power of two here: exact in floating point). The gathered
  gradients (``DTensor.full_tensor()``) must equal the single-process full-batch ones.
  This check matters because AdamW is nearly invariant to the gradient's scale: a
  gradient ``world`` times too large (gloo summing instead of averaging) moves the
  parameters almost as the right one does (measured on 2 ranks: 1.6e-3 of the training
  movement after 3 steps, against 4e-6 when right), while here it reads 1.0.
* **Parameters after a few AdamW steps** (``foreach=False`` on both sides, for identical
  arithmetic), gathered with ``full_tensor()``, against a single-process copy with the
  same init trained on the whole batch, by the norm of the difference relative to the
  training movement (<= 1e-4; see :data:`PARAM_TOL` for why not a per-element max).
* **bf16 compute.** ``MixedPrecisionPolicy(param_dtype=torch.bfloat16,
  reduce_dtype=torch.float32)``: the sharded parameters and AdamW stay fp32, each
  forward/backward runs on a bf16 all-gathered copy, and gradients are cast to fp32 before
  the reduce-scatter. The reference does the same arithmetic in one process (a bf16 copy
  of fp32 master weights, one backward per rank share, fp32 sum of the shares, fp32
  AdamW), so the fp32 bound applies; the bf16 run is also compared with the fp32
  full-batch reference, where the bound is loose (see :data:`BF16_DRIFT_TOL`).

Whether the gloo backend honours ``ReduceOp.AVG`` is *measured* with
:func:`shardlab.distributed.avg_probe.probe_avg_ratio`; the force-sum workaround is applied only
when the probe says AVG is summed (torch 2.8's gloo summed; on 2.13 the probe reads 1).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from shardlab.config.model import ModelShape
from shardlab.distributed.avg_probe import needs_force_sum, probe_avg_ratio
from shardlab.distributed.launch import RankContext
from shardlab.nn.data import Batch, batches, global_token_normalizer
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import TransformerLM
from shardlab.verify.registry import GLOBAL_BATCH, check

SEQ = 32
SHAPE = ModelShape(name="fsdp2-tiny", layers=2, d_model=32, heads=4,
                   vocab=garden_vocab().size, context=SEQ, style="llama", tied=False)
SEED = 0  # model init and data order
STEPS = 3
LR = 1e-2
# First-step gradients, per tensor max |diff| / max |reference|: the FSDP side sums two
# (or four) share gradients where the reference sums one batch; fp32 reassociation is
# ~5e-7 here. A gradient `world` times too large would read 1 (or more).
GRAD_TOL = 1e-5
# Parameters after AdamW are compared by ||p - p_ref|| / ||p_ref - p_init|| (the error
# relative to how far training moved them), not by a per-element max: AdamW's update is
# lr * m / (sqrt(v) + eps), which on the first step is lr * g / (|g| + eps), so a gradient
# element near zero turns a 1e-7 reassociation error into a change of the update's sign
# and a parameter off by up to 2 * lr. Measured on 2 and 4 ranks: ~4e-6 and ~7e-6 by the
# norm, ~1.5e-4 and ~3e-4 by the per-tensor max (detail reports both).
PARAM_TOL = 1e-4
# bf16 compute against the fp32 reference: bf16 keeps 8 significant bits (rounding 2**-9
# ~ 2e-3 per operation, compounding through the layers) and the sign flips above now come
# from bf16 rounding instead of fp32 reassociation. Measured ~7e-2 by the norm (~0.46 by
# the per-tensor max) on 2 and 4 ranks; the bound states the order of magnitude. The
# exact bf16 claim is bf16_params_equal_same_arithmetic, under PARAM_TOL.
BF16_DRIFT_TOL = 0.25


def training_data(steps: int = STEPS) -> list[Batch]:
    """``steps`` global batches of GLOBAL_BATCH garden documents (deterministic)."""
    stream = batches(garden_documents(64, seed=SEED), GLOBAL_BATCH, SEQ, seed=SEED)
    return [next(stream) for _ in range(steps)]


def new_model(device: torch.device, seed: int = SEED) -> TransformerLM:
    """The tiny llama-style LM, initialised from ``seed``, on ``device``."""
    return TransformerLM(SHAPE, seed=seed).to(device)


def new_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.AdamW:
    """AdamW with the per-parameter (``foreach=False``) loop on every side."""
    return torch.optim.AdamW(params, lr=LR, foreach=False)


def dp_mesh(ctx: RankContext) -> Any:
    """A 1-D :class:`DeviceMesh` over all ranks (reuses the default process group)."""
    return init_device_mesh(torch.device(ctx.device).type, (ctx.world_size,))


def force_sum_needed(ctx: RankContext) -> bool:
    """Probe gloo/NCCL's ``ReduceOp.AVG`` (a collective) and decide on the workaround."""
    return needs_force_sum(probe_avg_ratio(ctx), ctx.world_size)


def shard(model: TransformerLM, mesh: Any, force_sum: bool,
          mp_policy: Any = None) -> TransformerLM:
    """``fully_shard`` each block, then the root; force-sum on every FSDP module if asked.

    ``FSDPModule.set_force_sum_reduction_for_comms`` is per module (per param group), so it
    is set on the blocks and on the root alike.
    """
    policy = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if force_sum:
        for module in [*model.blocks, model]:
            module.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    return model


def share_loss(model: nn.Module, share: Batch, normalizer: int, scale: int) -> torch.Tensor:
    """``lm_loss_sum`` of ``share`` over the global token count, times ``scale``.

    Logits are cast to fp32 first (under the bf16 policy the model returns bf16 logits).
    ``scale`` is the world size on FSDP ranks (FSDP2 divides the reduced gradient by it)
    and 1 for a one-process reference on the whole batch.
    """
    logits = model(share.input_ids, share.pad_mask).float()
    return lm_loss_sum(logits, share.targets, share.loss_mask) / normalizer * scale


def to_device(batch: Batch, device: torch.device) -> Batch:
    """The batch's four tensors on ``device``."""
    return Batch(*(t.to(device) for t in (batch.input_ids, batch.targets, batch.loss_mask,
                                          batch.pad_mask)))


def full_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Plain fp32 CPU copies; DTensors are gathered with ``full_tensor()`` (a collective)."""
    out = {}
    for name, t in named:
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        out[name] = full.detach().float().cpu().clone()
    return out


def rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over tensors of max |a - b| / max |b| (b the reference)."""
    if a.keys() != b.keys():
        raise KeyError(f"different tensors: {sorted(a.keys() ^ b.keys())}")
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)) for k in b)


def norm_drift(a: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
               init: dict[str, torch.Tensor]) -> float:
    """||a - ref|| / ||ref - init|| over all tensors: the error relative to the training
    movement (robust to AdamW's per-element sign sensitivity, unlike a max)."""
    num = sum(float((a[k] - ref[k]).double().square().sum()) for k in ref)
    den = sum(float((ref[k] - init[k]).double().square().sum()) for k in ref)
    return (num / den) ** 0.5


def fsdp_train(ctx: RankContext, data: Sequence[Batch], force_sum: bool,
               mp_policy: Any = None) -> tuple[TransformerLM, torch.optim.AdamW,
                                               dict[str, torch.Tensor]]:
    """Shard a fresh model, train it ``len(data)`` steps on this rank's shares.

    Returns the model, its optimizer and the gathered gradients of the first step.
    """
    device = torch.device(ctx.device)
    model = shard(new_model(device), dp_mesh(ctx), force_sum, mp_policy)
    opt = new_optimizer(model.parameters())
    first: dict[str, torch.Tensor] = {}
    for step, batch in enumerate(data):
        normalizer = global_token_normalizer(batch)
        mine = to_device(batch.chunk(ctx.rank, ctx.world_size), device)
        # x world: FSDP2's reduce-scatter averages (AVG, or SUM then / world under force-sum)
        share_loss(model, mine, normalizer, ctx.world_size).backward()
        if step == 0:
            first = full_tensors((n, p.grad) for n, p in model.named_parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt, first


def reference_fp32(device: torch.device, data: Sequence[Batch]
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One process, whole batches, fp32: final parameters and first-step gradients."""
    model = new_model(device)
    opt = new_optimizer(model.parameters())
    first: dict[str, torch.Tensor] = {}
    for step, batch in enumerate(data):
        share_loss(model, to_device(batch, device), global_token_normalizer(batch), 1).backward()
        if step == 0:
            first = full_tensors((n, p.grad) for n, p in model.named_parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return full_tensors(model.named_parameters()), first


def reference_same_arithmetic(device: torch.device, data: Sequence[Batch], world: int,
                              compute_dtype: torch.dtype = torch.float32
                              ) -> dict[str, torch.Tensor]:
    """One process doing FSDP2's arithmetic: final parameters.

    fp32 master weights and AdamW; each step a ``compute_dtype`` copy (what
    ``MixedPrecisionPolicy(param_dtype=...)`` all-gathers) computes one backward per rank
    share (loss x world, as the ranks do); the gradients are cast to fp32 (the
    ``reduce_dtype``), summed in rank order and divided by ``world`` (the reduce-scatter's
    average).
    """
    master = new_model(device)
    opt = new_optimizer(master.parameters())
    for batch in data:
        normalizer = global_token_normalizer(batch)
        compute = copy.deepcopy(master).to(compute_dtype)
        total = {n: torch.zeros_like(p) for n, p in master.named_parameters()}
        for share in batch.split(world):
            compute.zero_grad(set_to_none=True)
            share_loss(compute, to_device(share, device), normalizer, world).backward()
            for n, p in compute.named_parameters():
                total[n] += p.grad.float()
        for n, p in master.named_parameters():
            p.grad = total[n] / world
        opt.step()
        opt.zero_grad(set_to_none=True)
    return full_tensors(master.named_parameters())


def layout_checks(ctx: RankContext, model: TransformerLM) -> list[dict[str, object]]:
    """Every parameter a Shard(0) DTensor; this rank's share of the elements ~ 1/world."""
    params = list(model.named_parameters())
    wrong = [n for n, p in params
             if not isinstance(p, DTensor) or tuple(p.placements) != (Shard(0),)]
    modules_ok = isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule)
                                                        for b in model.blocks)
    local = sum(p.to_local().numel() for _, p in params)  # type: ignore[attr-defined]
    total = sum(p.numel() for _, p in params)  # DTensor.numel() is the global size
    fraction = local / total
    return [
        check("params_are_shard0_dtensors", float(len(wrong)) + (0.0 if modules_ok else 1.0),
              0.0, detail=f"{len(params) - len(wrong)}/{len(params)} parameters are "
                          f"DTensor(Shard(0)); blocks and root FSDPModule: {modules_ok}"
                          + (f"; not: {wrong}" if wrong else "")),
        check("local_numel_fraction", abs(fraction - 1 / ctx.world_size), 0.05,
              detail=f"rank {ctx.rank} holds {local}/{total} = {fraction:.4f} of the "
                     f"elements (1/world = {1 / ctx.world_size:.4f})"),
    ]


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """fp32 and bf16 FSDP2 runs against one-process references. Writes nothing."""
    device = torch.device(ctx.device)
    world = ctx.world_size
    data = training_data()
    force = force_sum_needed(ctx)
    how = "force-sum applied (AVG summed)" if force else "AVG honoured, no workaround"

    model, _, grads = fsdp_train(ctx, data, force)
    ref_params, ref_grads = reference_fp32(device, data)
    params = full_tensors(model.named_parameters())
    init = full_tensors(new_model(device).named_parameters())
    checks = layout_checks(ctx, model)
    grad_diff = rel_diff(grads, ref_grads)
    checks.append(check("fp32_first_grads_equal_full_batch", grad_diff, GRAD_TOL,
                        detail=f"per-tensor max|diff|/max|ref| {grad_diff:.2e}; {how}"))
    full_norm = norm_drift(params, ref_params, init)
    checks.append(check("fp32_params_equal_one_process", full_norm, PARAM_TOL,
                        detail=f"{STEPS} AdamW steps vs one process on whole batches: "
                               f"||diff||/||moved|| {full_norm:.2e}; per-tensor "
                               f"max|diff|/max|ref| {rel_diff(params, ref_params):.2e} "
                               f"(AdamW's sign sensitivity at near-zero gradients)"))

    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model16, _, _ = fsdp_train(ctx, data, force, bf16)
    not_fp32 = [n for n, p in model16.named_parameters() if p.dtype != torch.float32]
    checks.append(check("bf16_sharded_params_stay_fp32", float(len(not_fp32)), 0.0,
                        detail="MixedPrecisionPolicy casts only the all-gathered compute "
                               "copy" + (f"; not fp32: {not_fp32}" if not_fp32 else "")))
    params16 = full_tensors(model16.named_parameters())
    emulated = reference_same_arithmetic(device, data, world, torch.bfloat16)
    emu = norm_drift(params16, emulated, init)
    checks.append(check("bf16_params_equal_same_arithmetic", emu, PARAM_TOL,
                        detail=f"vs one process with bf16 compute copies, per-share backward, "
                               f"fp32 reduce and AdamW: ||diff||/||moved|| {emu:.2e}, "
                               f"per-tensor max|diff|/max|ref| {rel_diff(params16, emulated):.2e}"))
    drift = norm_drift(params16, ref_params, init)
    checks.append(check("bf16_drift_from_fp32", drift, BF16_DRIFT_TOL,
                        detail=f"||p_bf16 - p_fp32|| / ||p_fp32 - p_init|| = {drift:.2e}; "
                               f"per-tensor max|diff|/max|ref| "
                               f"{rel_diff(params16, ref_params):.2e} (bf16 rounding, loose)"))
    dist.barrier()
    return checks
