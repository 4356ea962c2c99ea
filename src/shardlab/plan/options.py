"""The step-time options a plan prices an accelerator with: a framework's defaults, then
the ``--layout`` keys that override them (``shardlab plan``, ``budget``'s explain-fit and
the validation table all start here)."""

from __future__ import annotations

import re
from dataclasses import replace

from shardlab.config.dtypes import DtypePolicy, with_optimizer_dtype
from shardlab.config.hardware import Accelerator
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.estimate.activations import RECOMPUTE_MODULES
from shardlab.estimate.fp8 import RECIPE_CAST_BYTES
from shardlab.plan.expert_time import DISPATCHERS, ROUTINGS
from shardlab.plan.overlap import (
    BACKWARD_PREFETCH,
    FLASH_KERNELS,
    FUSED_LOSS_BYTES,
    FUSED_LOSS_PEAK,
    REDUCE_BYTES,
)
from shardlab.plan.overlap import framework as overlap_framework
from shardlab.plan.search import is_this_machine, layout_flag
from shardlab.plan.step_inputs import StepOptions


def check_trainable(keys: dict[str, str]) -> None:
    """SpecError for a ``--layout`` key that ``shardlab train`` cannot run, where it runs
    the layout (this machine, ``--dry-run-top``, ``--emit-config``): its AdamW keeps fp32
    state, it offloads no activations, and its selective recompute is its own."""
    for key, plain in (("optimizer_dtype", "fp32"), ("offload_layers", "0"),
                       ("recompute_modules", None), ("backward_prefetch", "pre")):
        value = keys.get(key)
        if value is None or (plain in ("fp32", "pre") and value.lower() == plain) or (
                plain == "0" and value.isascii() and value.isdigit() and int(value) == 0):
            continue
        fix = "leave it out" if plain is None else f"give {key}={plain} or leave it out"
        raise SpecError(key, value, "is not what shardlab train runs (this machine, "
                        "--dry-run-top, --emit-config: fp32 Adam state, no offloading, its "
                        f"own selective recompute, FSDP2's prefetch): {fix}")


def policy_for(policy: DtypePolicy, overrides: dict[str, str] | None) -> DtypePolicy:
    """``policy`` as the ``--layout`` keys of ``overrides`` change it: ``optimizer_dtype``
    sets Adam's state bytes (:func:`shardlab.config.dtypes.with_optimizer_dtype`)."""
    value = (overrides or {}).get("optimizer_dtype")
    return policy if value is None else with_optimizer_dtype(policy, value)


BLACKWELL: tuple[str, ...] = ("B200", "GB200")
"""The catalog's sm100 accelerators, where Transformer Engine's cuDNN attention trains only
the head dims :func:`te_falls_back` lets through."""


def te_falls_back(model: ModelShape, acc: Accelerator) -> bool:
    """Whether Transformer Engine trains ``model``'s attention with FlashAttention-2 on
    ``acc`` for want of cuDNN's fused kernel: on Blackwell (sm100) cuDNN's training kernel
    takes head dims of at most 128, latent attention's 192/128 (cuDNN 9.11) and 256/256
    (cuDNN 9.23) (``nvte_get_fused_attn_backend``, TE 2.18's fused_attn.cpp); TE's backend
    selection (``get_attention_backend``) then allows FlashAttention-2 for equal query/key
    and value head dims up to 256 (multiples of 8). A latent model's value head differs from
    its key's, so it never falls back to FlashAttention-2."""
    if acc.name not in BLACKWELL or model.mla is not None:
        return False
    d = model.head_dim
    return 128 < d < 256 and d % 8 == 0


def megatron_falls_back(model: ModelShape | None, acc: Accelerator, framework: str | None,
                        overrides: dict[str, str] | None) -> bool:
    """Whether a Megatron-LM plan of ``model`` on ``acc`` prices FlashAttention-2 for TE's
    fallback (:func:`te_falls_back`): ``--framework megatron`` and no ``flash_kernel=`` key
    naming the kernel a run used."""
    return (model is not None and overlap_framework(framework).name == "megatron"
            and "flash_kernel" not in (overrides or {}) and te_falls_back(model, acc))


def step_options_for(acc: Accelerator, *, flash: bool, overlap_dp: bool = True,
                     framework: str | None = None,
                     overrides: dict[str, str] | None = None,
                     model: ModelShape | None = None) -> StepOptions:
    """The step-time options ``shardlab plan`` prices ``acc`` with: ``framework``'s defaults
    (:data:`shardlab.plan.overlap.FRAMEWORKS`; None: the planner's own), then the
    ``--layout`` keys of ``overrides`` (:data:`shardlab.plan.search.STEP_KEYS`: a run's
    ``flash_kernel``, its FSDP ``reduce_dtype``, a fused loss (``fused_loss=1``), its
    ``fp8_recipe`` and its MoE ``dispatcher`` and ``routing`` among them);
    ``overlap_dp=False`` (``--no-overlap-dp``) turns data-parallel overlap off. On this
    machine the ranks' cores also move the bytes (no overlap), and ``shardlab train`` is
    eager torch (gradients accumulate in their own pass, FSDP's reduced after every
    micro-batch). With ``model``, Megatron-LM's attention on Blackwell is FlashAttention-2
    where Transformer Engine has no cuDNN kernel for its head dim (:func:`te_falls_back`)
    and no ``flash_kernel=`` key names one. SpecError for an unknown framework or a bad
    value."""
    here = is_this_machine(acc)
    fw = overlap_framework(framework)
    opts = fw.options()
    for key, value in (overrides or {}).items():
        if key == "optimizer_dtype":
            continue  # a dtype-policy key: :func:`policy_for`
        if key == "reduce_dtype":
            # A stated FSDP policy's reduce_dtype replaces the framework's reduction bytes.
            if value.lower() not in REDUCE_BYTES:
                raise SpecError(key, value, f"must be one of {', '.join(REDUCE_BYTES)}")
            nbytes = REDUCE_BYTES[value.lower()]
            opts["grad_reduce_bytes"] = nbytes
            facts = opts.get("memory")
            if facts is not None:
                # A framework that holds its gradients in a buffer of the reduction's dtype
                # (Megatron-Core's DDP: grad_dtype = float32 if grad_reduce_in_fp32 else the
                # param's) holds them at these bytes; the others keep their own.
                held = nbytes if facts.held_grad_bytes else 0
                opts["memory"] = replace(facts, reduce_bytes=nbytes, held_grad_bytes=held)
            continue
        if key == "fused_loss":
            # A stated fused cross-entropy replaces the framework's loss bytes.
            if layout_flag(key, value):
                opts["loss_bytes"] = FUSED_LOSS_BYTES
                if opts.get("memory") is not None:
                    opts["memory"] = replace(opts["memory"], loss_bytes=FUSED_LOSS_PEAK,
                                             parallel_loss_bytes=0.0)
            continue
        if key in ("offload_layers", "recompute_modules") and fw.name not in ("none",
                                                                           "megatron"):
            raise SpecError(key, value, f"is Megatron-Core's: give --framework megatron (or "
                            f"none), not {fw.name}")
        if (key == "backward_prefetch" and value.lower() == "post"
                and fw.name not in ("none", "fsdp")):
            raise SpecError(key, value, f"post is PyTorch FSDP1's (--framework fsdp, or none): "
                            f"{fw.name} prefetches its backward gathers")
        if key == "offload_layers":
            # Megatron-Core's --cpu-offloading-num-layers (plan/offload.py).
            if not re.fullmatch(r"[0-9]{1,9}", value):
                raise SpecError(key, value, "must be a whole number of layers >= 0 (layers "
                                "per rank whose activations go to host memory)")
            opts[key] = int(value)
            continue
        if key == "recompute_modules":
            # Megatron-Core's --recompute-modules, '+'-separated (a comma separates keys).
            names = tuple(dict.fromkeys(value.lower().split("+")))
            for name in names:
                if name not in RECOMPUTE_MODULES:
                    known = ", ".join(RECOMPUTE_MODULES)
                    raise SpecError(key, value, f"modules must be of {known} joined by '+' "
                                    "(shared_experts is not priced)")
            opts[key] = names
            continue
        if key == "fp8_recipe":
            # Transformer Engine's recipe sets its casts' bytes (estimate/fp8.py); torchao's
            # float8 (torchtitan) casts in its own kernels.
            recipe = value.lower()
            if recipe not in RECIPE_CAST_BYTES:
                raise SpecError(key, value, f"must be one of {', '.join(RECIPE_CAST_BYTES)}")
            if fw.name == "torchtitan":
                raise SpecError(key, value, "is Transformer Engine's: torchtitan's torchao "
                                "float8 is priced with its own casts")
            opts.update(fp8_recipe=recipe, fp8_cast_bytes=RECIPE_CAST_BYTES[recipe])
            continue
        if key in ("dispatcher", "routing", "backward_prefetch"):
            allowed = {"dispatcher": DISPATCHERS, "routing": ROUTINGS,
                       "backward_prefetch": BACKWARD_PREFETCH}[key]
            if value.lower() not in allowed:
                raise SpecError(key, value, f"must be one of {', '.join(allowed)}")
            opts[key] = value.lower()
            continue
        opts[key] = value
        if key in ("fused_norm", "fused_accumulation", "fp8_params", "overlap_ep"):
            opts[key] = layout_flag(key, value)
        elif key == "flash_kernel":
            if value.lower() not in FLASH_KERNELS:
                raise SpecError(key, value, f"must be one of {', '.join(FLASH_KERNELS)}")
            if value.lower() == "fp8" and fw.name not in ("none", "megatron"):
                raise SpecError(key, value, "is Megatron's fp8 attention (Transformer "
                                f"Engine's): give --framework megatron (or none), not "
                                f"{fw.name}; its kernels: fa2, fa3, triton, fa1")
            opts[key] = value.lower()
        elif key == "overlap_tp" and value.lower() not in ("forward",):
            # overlap_tp=1 is the framework's kind of tensor-parallel overlap.
            opts[key] = fw.tp_overlap_kind if layout_flag(key, value) else "off"
    if opts.get("overlap_ep") and "moe" in opts.get("recompute_modules", ()):
        # Megatron-Core asserts it (transformer_config.py: the merged forward-backward of
        # the all-to-all overlap cannot run a checkpointed MoE layer again).
        raise SpecError("recompute_modules", "+".join(opts["recompute_modules"]),
                        "moe cannot be recomputed with overlap_ep=1 (Megatron-Core refuses it)")
    if megatron_falls_back(model, acc, framework, overrides):
        opts["flash_kernel"] = "fa2"
    if not overlap_dp:
        opts["overlap_dp"] = "off"
    if here:
        # shardlab train: FSDP2 reduce-scatters after every micro-batch (train/rank.py).
        opts.update(overlap_dp="off", overlap_tp="off", overlap_pp="off",
                    fused_accumulation=False, reduce_each_micro=True)
    return StepOptions(flash=flash, **opts)  # type: ignore[arg-type]
