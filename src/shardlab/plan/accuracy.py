"""How far the planner's step time has been from measured runs like the one planned: the
held-out slices of ``docs/validation.md``, shown beside a plan.

A plan's step time is a prediction; the only honest statement of its error is the error
the same model made on published runs it was never fitted on
(:mod:`shardlab.plan.published`). Those runs fall into slices by what changes the model's
error most (accelerator, dtype, dense or MoE, framework, pipeline and context parallel,
HSDP, uneven stages, scale): :data:`SLICES` defines them on a run's :class:`Traits`, and
:data:`HELD_OUT` keeps each slice's figures as ``python -m shardlab.plan.published``
prints them (``tests/plan/test_published.py`` recomputes them from the runs and fails
when the two part, so a change of the model that moves them must store them again).
:func:`accuracy` picks the slices a planned layout belongs to: ``shardlab plan`` prints
them under its tables and in ``--json`` (``accuracy``).

The signed mean says which way a slice errs: below zero, the planner predicted those runs
faster than they ran. No figure here is used to correct a prediction: that would fit the
model on the held-out runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Traits:
    """What places a run (or a planned layout) in the slices: the accelerator's catalog
    name, the dtype its linear layers run in (a policy's ``linear_compute``: bf16, fp16,
    fp8, fp32), the framework named (None: none), whether the model is a mixture of
    experts, the device count and the layout's pipeline, context and HSDP degrees,
    whether its pipeline stages are uneven, the routed experts each expert-parallel
    rank holds (0 for a dense model), and whether its attention is latent (DeepSeek's)."""

    gpu: str
    dtype: str
    framework: str | None
    moe: bool
    gpus: int
    pp: int = 1
    cp: int = 1
    dp_replicate: int = 1
    uneven: bool = False
    local_experts: float = 0.0
    latent: bool = False


MANY_LOCAL_EXPERTS = 8
"""Experts a rank from which a MoE layout is in the slice "MoE, 8 or more experts a rank".
That slice was added after its runs' gap was known (docs/validation.md, "Where the model
is weakest": Megatron-Core's MoE rows with 8 or 16 local experts predicted 1.1-1.5x fast),
to warn a plan whose winner is like them, not to score the model: it corrects nothing."""


SIXTEEN_BIT: tuple[str, ...] = ("bf16", "fp16")
"""The 16-bit dtypes linear layers run in (a policy's ``linear_compute``; the published runs'
bf16 and fp16)."""

SLICES: dict[str, Callable[[Traits], bool]] = {
    "bf16 / fp16": lambda t: t.dtype in SIXTEEN_BIT,
    "A100": lambda t: t.gpu in ("A100 SXM 80GB", "A100 SXM 40GB"),
    "H100/H200": lambda t: t.gpu in ("H100 SXM", "H200 SXM"),
    "B200/GB200": lambda t: t.gpu in ("B200", "GB200"),
    "fp8": lambda t: t.dtype == "fp8",
    "dense": lambda t: not t.moe,
    "MoE": lambda t: t.moe,
    "MoE, 8 or more experts a rank": lambda t: t.local_experts >= MANY_LOCAL_EXPERTS,
    "latent attention (DeepSeek-V3)": lambda t: t.latent,
    "Megatron-LM / NeMo": lambda t: t.framework == "megatron",
    "torchtitan": lambda t: t.framework == "torchtitan",
    "FSDP (MosaicML, fms-fsdp, NeMo AutoModel)": lambda t: t.framework == "fsdp",
    "DeepSpeed (BLOOM, BloombergGPT)": lambda t: t.framework == "deepspeed",
    "pipeline parallel": lambda t: t.pp > 1,
    "context parallel": lambda t: t.cp > 1,
    "HSDP": lambda t: t.dp_replicate > 1,
    "uneven pipeline stages": lambda t: t.uneven,
    "one node (8 GPUs or fewer)": lambda t: t.gpus <= 8,
    "over 1,000 GPUs": lambda t: t.gpus > 1000,
}
"""Slices of the held-out runs (a run may be in several), by their :class:`Traits`."""

WARNINGS: frozenset[str] = frozenset({"MoE, 8 or more experts a rank"})
"""Slices drawn around a gap already known (:data:`MANY_LOCAL_EXPERTS`): a warning for a plan
like them, not a score of the model; shown as such."""

HELD_OUT: dict[str, tuple[int, float, float, float]] = {
    "bf16 / fp16": (93, 0.077, -0.002, 0.513),
    "A100": (35, 0.068, -0.012, 0.513),
    "H100/H200": (87, 0.079, 0.0, 0.363),
    "B200/GB200": (39, 0.068, -0.023, 0.463),
    "fp8": (68, 0.07, -0.017, 0.352),
    "dense": (129, 0.065, 0.002, 0.513),
    "MoE": (32, 0.11, -0.049, 0.463),
    "MoE, 8 or more experts a rank": (13, 0.134, -0.102, 0.331),
    "latent attention (DeepSeek-V3)": (10, 0.122, -0.092, 0.463),
    "Megatron-LM / NeMo": (98, 0.073, -0.012, 0.463),
    "torchtitan": (26, 0.066, 0.008, 0.352),
    "FSDP (MosaicML, fms-fsdp, NeMo AutoModel)": (27, 0.055, 0.002, 0.192),
    "DeepSpeed (BLOOM, BloombergGPT)": (2, 0.337, -0.337, 0.513),
    "pipeline parallel": (74, 0.067, -0.027, 0.463),
    "context parallel": (16, 0.077, 0.024, 0.352),
    "HSDP": (3, 0.198, -0.198, 0.513),
    "uneven pipeline stages": (26, 0.096, -0.067, 0.463),
    "one node (8 GPUs or fewer)": (28, 0.094, 0.049, 0.352),
    "over 1,000 GPUs": (18, 0.074, -0.009, 0.155),
}
"""Per slice: held-out runs, mean absolute step-time error, mean signed error (predicted /
measured - 1) and the worst absolute one, each rounded to 0.1%, as ``python -m
shardlab.plan.published`` prints them (the catalog's curves, no anchor)."""

FEW = 5
"""A slice of fewer held-out runs than this is said to be thin (its figures say little)."""


def accuracy(traits: Traits) -> list[dict[str, Any]]:
    """The slices ``traits`` belongs to, each with its held-out figures (fractions, not
    percent): ``slice``, ``runs``, ``mean_abs_error``, ``mean_error`` (signed),
    ``worst_abs_error``, ``thin`` (fewer than :data:`FEW` runs) and ``warning`` (a slice of
    :data:`WARNINGS`, drawn after its gap was known)."""
    return [{"slice": name, "runs": runs, "mean_abs_error": mean_abs, "mean_error": mean,
             "worst_abs_error": worst, "thin": runs < FEW, "warning": name in WARNINGS}
            for name, take in SLICES.items() if take(traits)
            for runs, mean_abs, mean, worst in (HELD_OUT[name],)]


ACCELERATOR_SLICES: tuple[str, ...] = ("A100", "H100/H200", "B200/GB200")
"""The slices by accelerator: a plan on none of them has no held-out run on its device."""
DTYPE_SLICES: tuple[str, ...] = ("bf16 / fp16", "fp8")
"""The slices by dtype: a plan in neither (fp32 on a GPU) has no held-out run in its dtype."""


def uneven(stage_layers: tuple[int, ...] | list[int]) -> bool:
    """Whether a split of layers over pipeline chunks is uneven (an even split given
    explicitly is not)."""
    return len(set(stage_layers)) > 1


def plan_accuracy(gpu: str, linear_dtype: str, curve_fitted: bool, framework: str | None,
                  moe: bool, gpus: int, best: dict[str, Any], experts: int = 0,
                  latent: bool = False) -> dict[str, Any]:
    """The ``accuracy`` of ``shardlab plan --json`` for its winner ``best`` on ``gpus``
    devices named ``gpu`` whose linear layers run in ``linear_dtype`` (a MoE model's
    ``experts`` routed experts over the winner's ``ep``; ``latent``: latent attention): ``slices``
    (:func:`accuracy`); ``accelerator_held_out`` and ``dtype_held_out``, whether any
    held-out run was on that accelerator (no: MI300X, H100 PCIe, a hardware file's device,
    where the other slices are other devices' runs) and in that dtype (no: fp32); and
    ``curve_fitted``, whether the accelerator's efficiency curve was fitted on published
    runs (no: an assumed curve, so the plan's own error is unknown)."""
    slices = accuracy(Traits(gpu, linear_dtype, framework, moe, gpus, int(best["pp"]),
                             int(best.get("cp", 1)), int(best.get("dp_replicate", 1)),
                             uneven(best.get("stage_layers") or ()),
                             experts / int(best.get("ep", 1)) if moe else 0.0, latent))
    names = {s["slice"] for s in slices}
    return {"slices": slices, "accelerator_held_out": bool(names & set(ACCELERATOR_SLICES)),
            "dtype_held_out": bool(names & set(DTYPE_SLICES)), "curve_fitted": curve_fitted}
