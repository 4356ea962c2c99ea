"""The planner: every layout of a model on a cluster, the ones that fit, ranked by step time.

:func:`plan` enumerates the space (:mod:`shardlab.plan.space`), computes every valid
layout's memory per device (:mod:`shardlab.plan.memory`), drops those over the usable
memory, times the rest (:mod:`shardlab.plan.step_time`) and returns them fastest
first, with counts of what was rejected and why. Everything after the enumeration is
numpy over all layouts at once.

"This machine" (the CPU that ``shardlab hardware --measure`` stored) is planned as
``gpus`` processes sharing it: each gets ``cpu_count // gpus`` threads (the launcher's
rule) and so that share of the measured peak, and memory / gpus bytes.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.hardware import Accelerator, matmul_peaks
from shardlab.config.layout import (
    RECOMPUTE,
    SCHEDULES,
    Layout,
    make_layout,
    parse_stage_layers,
)
from shardlab.config.measured import NAME
from shardlab.config.model import ModelShape
from shardlab.config.resolve import model_field, model_label
from shardlab.errors import SpecError, require_positive_int
from shardlab.plan.efficiency import efficiency_of
from shardlab.plan.layer_time import probe_elementwise_bandwidth
from shardlab.plan.memory import memory_arrays, memory_options
from shardlab.plan.offload import check_offload, offload_refused
from shardlab.plan.rules import R_MEMORY, R_OFFLOAD, REASONS, check_rules
from shardlab.plan.space import (
    DP_MODE_OF_ZERO,
    TRAIN_SCHEDULES,
    TRAIN_ZERO,
    Candidates,
    Space,
    enumerate_search,
)
from shardlab.plan.step_time import (
    HIDDEN,
    PARTS,
    Device,
    StepOptions,
    step_seconds,
)

USABLE_MEMORY = 0.9
"""Share of a device's memory the planner lets a layout use: the rest is left for what the
cost model does not count (allocator fragmentation, communication buffers, CUDA context,
FSDP's transient unsharded layers)."""


def is_this_machine(acc: Accelerator) -> bool:
    """Whether ``acc`` is the stored measurement of this machine's CPU."""
    return acc.name == NAME


def device_of(acc: Accelerator, policy: DtypePolicy, gpus: int) -> tuple[Device, float]:
    """The step-time model's device and its memory in bytes (shared out on this machine)."""
    peak, linear_peak = matmul_peaks(acc, policy.compute, policy.linear_compute)
    memory = acc.memory_bytes
    bandwidth = acc.memory_bandwidth
    eff = efficiency_of(acc)
    one_thread = False
    if is_this_machine(acc):
        cores = os.cpu_count() or 1
        threads = cores // gpus
        peak *= max(1, threads) / cores if gpus <= cores else 1 / gpus
        memory /= gpus
        bandwidth /= gpus  # the processes stream through one memory bus at once
        if threads <= 1 and acc.single_thread is not None and policy.compute == "fp32":
            # Each process runs one thread: the one-thread curve (training-shaped matmuls),
            # at no more than one thread reaches alone nor than its share of all cores
            # together (cores that share a physical core or its caches do not add up).
            peak1, eff1 = acc.single_thread
            peak = min(peak, peak1 if gpus <= cores else peak1 * cores / gpus)
            eff = eff1
            one_thread = True
        if acc.runtime is not None:
            # The measured runtime's fixed costs include every operator's dispatch.
            eff = replace(eff, op_overhead=0.0, source=eff.source + "; the per-operator cost "
                          "is charged within the runtime's measured fixed costs instead")
    dev = Device(peak, bandwidth, acc.intra_link, acc.inter_link, acc.gpus_per_node, eff,
                 acc.runtime if is_this_machine(acc) else None,
                 linear_peak=linear_peak if policy.is_fp8 else 0.0, host_link=acc.host_link)
    if one_thread and acc.layer_probe is not None:
        # One-thread ranks: memory-bound operators at the rate the measured layer shows,
        # no faster than this rank's share of the memory bandwidth.
        rate = probe_elementwise_bandwidth(acc.layer_probe, dev)
        if rate is not None:
            dev = replace(dev, elementwise_bandwidth=min(rate, bandwidth))
    return dev, memory


@dataclass
class Plan:
    """What :func:`plan` found. ``best`` holds the top layouts as JSON-ready dicts."""

    candidates_evaluated: int
    feasible: int
    rejected: dict[str, int]
    best: list[dict[str, Any]]
    seconds: float
    smallest_memory: float
    device_memory: float
    device: Device = field(repr=False)
    notes: list[str] = field(default_factory=list)
    """What the search left out and why (uneven splits past the layout limit)."""


def _entries(c: Candidates, idx: np.ndarray, times: dict[str, np.ndarray], mem: Any,
             usable: float, global_batch: int, seq: int,
             train_prefix: str | None, train_dtype: str, by_op: bool = False
             ) -> list[dict[str, Any]]:
    out = []
    for i in idx.tolist():
        lay = c.layout(i)
        entry: dict[str, Any] = {
            **lay,
            "step_seconds": float(times["step"][i]),
            "tokens_per_second": global_batch * seq / float(times["step"][i]),
            "mfu": float(times["mfu"][i]),
            "memory_per_device": float(mem.total[i]),
            "fits": bool(mem.total[i] <= usable),
            "breakdown": {k: float(times[k][i]) for k in PARTS},
            # Communication overlapped with compute (not in step_seconds), per part.
            "hidden": {k: float(times[f"hidden_{k}"][i]) for k in HIDDEN},
            "memory_breakdown": {"weights": float(mem.weights[i]),
                                 "gradients": float(mem.gradients[i]),
                                 "optimizer": float(mem.optimizer[i]),
                                 "activations": float(mem.activations[i]),
                                 "transient": float(mem.transient[i]),
                                 "offloaded_to_host": float(mem.offloaded[i]),
                                 "stage": int(mem.stage[i])},
            "timed_stage": int(times["stage"][i]),
            "train_command": None,
        }
        if train_prefix is not None:
            entry["train_command"] = train_command(train_prefix, lay, global_batch, seq,
                                                   train_dtype, by_op)
        out.append(entry)
    return out


def trains_by_op(selective: str | None, moe: bool) -> bool:
    """Whether ``shardlab train`` runs a plan's selective layouts as per-operator
    checkpointing (``--recompute op``): the plan's framework checkpoints per operator
    (``StepOptions.selective == "op"``, torchtitan) and the model is dense (train refuses
    ``op`` for a MoE)."""
    return selective == "op" and not moe


def trains_fp8_gathers(lay: dict[str, Any], dtype: str) -> bool:
    """Whether ``shardlab train`` runs a plan entry with ``--fp8-all-gather``: the plan
    prices ZeRO-3's weight gathers at the fp8 policy's 1 byte (:mod:`shardlab.plan.dp_time`),
    which train does with torchao's fp8 all-gather, over FSDP of more than one rank (a
    MoE's routed experts, which train keeps bf16, gather bf16)."""
    return dtype == "fp8" and lay["zero"] == 3 and lay["dp"] * lay.get("cp", 1) > 1


def train_recompute(recompute: str, by_op: bool) -> str:
    """``shardlab train``'s ``--recompute`` for a plan entry's (:func:`trains_by_op`)."""
    return "op" if by_op and recompute == "selective" else recompute


def train_command(prefix: str, lay: dict[str, Any], global_batch: int, seq: int,
                  dtype: str, by_op: bool = False) -> str:
    """``shardlab train`` flags for a layout (ZeRO 0/2/3 as ddp/fsdp-zero2/fsdp; dp = 1 as
    fsdp, which then shards nothing and works with tp > 1; ``--ep``,
    ``--capacity-factor``, ``--cp``, ``--dp-replicate`` and ``--stage-layers`` only where
    they differ from a plain layout's; train builds whole
    experts, its default ``--etp 1``, the only etp a train-only space keeps). ``by_op``
    (:func:`trains_by_op`): a selective layout runs ``--recompute op``; an fp8 ZeRO-3
    layout gathers in fp8 (:func:`trains_fp8_gathers`)."""
    mode = "fsdp" if lay["dp"] == 1 else DP_MODE_OF_ZERO[lay["zero"]]
    parts = [prefix, f"--seq {seq}", f"--dp {lay['dp']}", f"--tp {lay['tp']}",
             f"--pp {lay['pp']}"]
    if lay["virtual_stages"] > 1:
        parts.append(f"--virtual-stages {lay['virtual_stages']}")
    parts.append(f"--dp-mode {mode}")
    if lay["sp"]:
        parts.append("--sp")
    parts += [f"--recompute {train_recompute(lay['recompute'], by_op)}"]
    if lay["pp"] > 1:
        parts.append(f"--schedule {lay['schedule']}")
    parts += [f"--global-batch {global_batch}", f"--micro-batch {lay['micro_batch']}",
              f"--dtype {dtype}"]
    if trains_fp8_gathers(lay, dtype):
        parts.append("--fp8-all-gather")
    if lay.get("ep", 1) > 1:
        parts.append(f"--ep {lay['ep']}")
    if lay.get("capacity_factor"):
        parts.append(f"--capacity-factor {lay['capacity_factor']:g}")
    if lay.get("cp", 1) > 1:
        parts.append(f"--cp {lay['cp']}")
    if lay.get("dp_replicate", 1) > 1:
        parts.append(f"--dp-replicate {lay['dp_replicate']}")
    if lay.get("stage_layers"):
        parts.append("--stage-layers " + ",".join(map(str, lay["stage_layers"])))
    return " ".join(parts)


def plan(model: ModelShape, acc: Accelerator, space: Space, policy: DtypePolicy, *,
         top: int = 10, options: StepOptions | None = None, dropout: bool = False,
         train_prefix: str | None = None, train_dtype: str = "fp32",
         only: Candidates | None = None, imbalance: float = 1.0) -> Plan:
    """Search ``space`` (or evaluate the layouts ``only``) and rank what fits by step time.
    ``imbalance``: the router's max/mean tokens per expert, for a MoE's routed activations.

    Raises SpecError when no layout is valid for the device count, or none fits in memory
    (naming the smallest memory per device any layout needs).
    """
    start = time.perf_counter()
    options = options or StepOptions()
    for key, value in (("fp8_params", "1" if options.fp8_params else ""),
                       ("fp8_recipe", options.fp8_recipe),
                       ("flash_kernel", "fp8" if options.flash_kernel == "fp8" else "")):
        if value and not policy.is_fp8:
            raise SpecError(key, value, f"is an fp8 setting: needs --dtype fp8, not "
                            f"{policy.name}")
    if model.style == "gpt" and space.seq > model.context:
        raise SpecError("seq", space.seq, f"must be <= the learned position table "
                        f"({model.context}) for a gpt-style model")
    c, note = (only, None) if only is not None else enumerate_search(model, space)
    n_off = options.offload_layers
    check_offload(n_off, model.layers, acc.host_link, acc.name)
    refused = offload_refused(c, n_off) & (c.reason < 0)
    if only is not None and refused.any():
        raise SpecError("offload_layers", n_off, "needs pp=1 and recompute=none (Megatron-Core "
                        "refuses CPU offloading with a pipeline or activation recomputation)")
    c.reason[refused] = REASONS.index(R_OFFLOAD)
    mods = options.recompute_modules
    if mods and not (c.recompute == RECOMPUTE.index("selective")).any():
        raise SpecError("recompute_modules", "+".join(mods), "needs recompute=selective "
                        "(Megatron's --recompute-granularity selective)")
    if model.moe is None and {"moe_act", "layernorm", "moe"} & set(mods):
        raise SpecError("recompute_modules", "+".join(mods), f"moe, moe_act and layernorm are "
                        f"a MoE layer's modules here ({model.name} is dense)")
    if model.mla is None and "mla_up_proj" in mods:
        raise SpecError("recompute_modules", "+".join(mods), f"mla_up_proj is latent "
                        f"attention's ({model.name} has none)")
    if not model.dense_layers and "mlp" in mods:
        raise SpecError("recompute_modules", "+".join(mods), f"mlp is a dense layer's MLP "
                        f"({model.name} has only MoE layers: theirs is moe)")
    dev, memory = device_of(acc, policy, space.gpus)
    usable = USABLE_MEMORY * memory
    valid = c.reason < 0
    if not valid.any():
        first = REASONS[int(np.bincount(c.reason).argmax())]
        raise SpecError("gpus", space.gpus, f"no layout of {model_label(model)} can use "
                        f"{space.gpus} devices (most fail: {first})")
    v = c.take(valid)
    mem = memory_arrays(model, v, space.seq, policy,
                        memory_options(options, dropout=dropout, imbalance=imbalance))
    fits = mem.total <= usable
    reason = c.reason.copy()
    reason[np.flatnonzero(valid)[~fits]] = REASONS.index(R_MEMORY)
    rejected = {REASONS[r]: int(n) for r, n in enumerate(np.bincount(reason[reason >= 0],
                                                                     minlength=len(REASONS)))
                if n}
    smallest = float(mem.total.min())
    if only is None and not fits.any():
        raise SpecError(*model_field(model), f"fits in no layout on {space.gpus} x {acc.name}: "
                        f"the smallest needs {smallest / 1e9:.2f} GB per device, "
                        f"{usable / 1e9:.2f} GB usable ({USABLE_MEMORY:.0%} of "
                        f"{memory / 1e9:.2f} GB)")
    keep = np.ones(len(v), bool) if only is not None else fits
    f = v.take(keep)
    fmem = type(mem)(*(getattr(mem, k)[keep] for k in ("weights", "gradients", "optimizer",
                                                       "activations", "params", "stage",
                                                       "expert_params", "transient",
                                                       "offloaded")))
    times = step_seconds(model, f, fmem, space.seq, space.global_batch, policy, dev, options)
    order = np.lexsort((fmem.total, times["step"]))[:top]
    best = _entries(f, order, times, fmem, usable, space.global_batch, space.seq,
                    train_prefix, train_dtype,
                    trains_by_op(options.selective, model.moe is not None))
    return Plan(len(c), int(fits.sum()), rejected, best, time.perf_counter() - start, smallest,
                usable, dev, [note] if note else [])


LAYOUT_KEYS = ("dp", "tp", "pp", "virtual", "micro_batch", "zero", "sp", "recompute",
               "schedule", "ep", "etp", "capacity_factor", "cp", "stage_layers",
               "dp_replicate")
STEP_KEYS = ("overlap_dp", "overlap_tp", "overlap_pp", "overlap_ep", "fused_norm",
             "fused_accumulation", "fp8_params", "flash_kernel", "reduce_dtype", "fused_loss",
             "dispatcher", "routing", "optimizer_dtype", "offload_layers",
             "recompute_modules", "backward_prefetch", "fp8_recipe")
"""``--layout`` keys of ``shardlab plan`` that set step-time options, not the layout
(:class:`~shardlab.plan.step_time.StepOptions`, :mod:`shardlab.plan.overlap`)."""


SP_VALUES: dict[str, bool] = {"0": False, "1": True, "false": False, "true": True,
                              "no": False, "yes": True, "off": False, "on": True}
"""What ``sp=`` reads in ``--layout`` (any case); anything else is refused, not read as off."""


def parse_layout(text: str, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """``"dp=1 tp=8 pp=8 ..."`` as a dict; SpecError on an unknown key (``extra`` keys are
    allowed besides :data:`LAYOUT_KEYS`), a bad pair or a key given twice (``dp=8 dp=4``
    is refused: which one was meant?)."""
    out: dict[str, str] = {}
    known = LAYOUT_KEYS + extra
    # Pairs are separated by spaces or commas; a comma inside a value (stage_layers=16,16)
    # continues that value.
    items: list[str] = []
    for piece in re.split(r"[\s,]+", text.strip()):
        if piece and "=" not in piece and items and re.fullmatch(r"[0-9+]+", piece) \
                and items[-1].startswith("stage_layers="):
            items[-1] += "," + piece
        elif piece:
            items.append(piece)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise SpecError("layout", item, "must be key=value")
        if key not in known:
            raise SpecError("layout", key, f"must be one of {', '.join(known)}")
        if key in out:
            raise SpecError(key, value, f"is given twice in --layout ({key}={out[key]} "
                            f"first): give each key once")
        out[key] = value
    return out


def layout_flag(key: str, value: str) -> bool:
    """A 0/1 ``--layout`` value (any of :data:`SP_VALUES`); SpecError naming ``key`` else."""
    if value.lower() not in SP_VALUES:
        raise SpecError(key, value, "must be 0 or 1 (or true/false, yes/no, on/off)")
    return SP_VALUES[value.lower()]


def layout_sp(raw: dict[str, str]) -> bool:
    """The ``sp=`` of a parsed ``--layout`` (absent: off); SpecError for a value that is not
    one of :data:`SP_VALUES`."""
    return layout_flag("sp", raw.get("sp", "0"))


def layout_step_keys(text: str | None) -> dict[str, str]:
    """The :data:`STEP_KEYS` of ``--layout`` text (empty for none), as given."""
    if not text:
        return {}
    return {k: v for k, v in parse_layout(text, STEP_KEYS).items() if k in STEP_KEYS}


def layout_capacity_factor(raw: dict[str, str], default: float = 0.0) -> float:
    """The ``capacity_factor=`` of a parsed ``--layout`` (absent: ``default``); SpecError
    for a value that is not a number (make_layout checks its range)."""
    if "capacity_factor" not in raw:
        return default
    try:
        return float(raw["capacity_factor"])
    except ValueError:
        raise SpecError("capacity_factor", raw["capacity_factor"], "must be a number "
                        "(0 = dropless)") from None


def given_layout(model: ModelShape, space: Space, text: str) -> Layout:
    """The layout ``--layout`` text names, checked by make_layout (the step-time keys,
    :data:`STEP_KEYS`, are read by :func:`layout_step_keys`; the dtype is bf16's)."""
    raw = parse_layout(text, STEP_KEYS)

    def integer(key: str, default: int) -> int:
        try:
            return int(raw.get(key, default))
        except ValueError:
            raise SpecError(key, raw[key], "must be an integer") from None

    tp, pp, virtual = integer("tp", 1), integer("pp", 1), integer("virtual", 1)
    cp = integer("cp", 1)
    for key, value in (("tp", tp), ("pp", pp), ("cp", cp)):
        require_positive_int(key, value)  # before dp's default divides by them
    dp = integer("dp", max(1, space.gpus // (tp * pp * cp)))
    sp = layout_sp(raw)
    split = (parse_stage_layers(raw["stage_layers"]) if "stage_layers" in raw
             else space.stage_layers)
    lay = make_layout(model, gpus=space.gpus, dp=dp, tp=tp, pp=pp, virtual_stages=virtual,
                      zero=integer("zero", 0), sp=sp, micro_batch=integer("micro_batch", 1),
                      global_batch=space.global_batch, seq=space.seq,
                      recompute=raw.get("recompute", "none"), schedule=raw.get("schedule"),
                      ep=integer("ep", 1), etp=integer("etp", tp),
                      capacity_factor=layout_capacity_factor(raw, space.capacity_factor),
                      cp=cp, stage_layers=split, dp_replicate=integer("dp_replicate", 1),
                      expert_fold=space.expert_fold)
    return lay


def layout_candidates(model: ModelShape, space: Space, text: str) -> Candidates:
    """One layout from ``--layout`` text (:func:`given_layout`) as :class:`Candidates`."""
    lay = given_layout(model, space, text)
    one = lambda x: np.array([x], dtype=np.int64)  # noqa: E731
    splits = ((), lay.stage_layers) if lay.stage_layers else ((),)
    c = Candidates(one(lay.dp), one(lay.tp), one(lay.pp), one(lay.virtual_stages),
                   one(SCHEDULES.index(lay.schedule)), one(lay.zero), np.array([lay.sp]),
                   one(RECOMPUTE.index(lay.recompute)), one(lay.micro_batch),
                   one(lay.microbatches), one(-1), one(lay.ep), one(lay.etp),
                   np.array([lay.capacity_factor]), one(lay.cp), one(lay.dp_replicate),
                   one(len(splits) - 1), splits, space.expert_fold)
    if space.train_only:
        if lay.dp > 1 and lay.zero not in TRAIN_ZERO:
            raise SpecError("zero", lay.zero, "shardlab train runs ZeRO 0 (ddp), 2 "
                            "(fsdp-zero2) or 3 (fsdp)")
        if lay.pp > 1 and lay.schedule not in TRAIN_SCHEDULES:
            raise SpecError("schedule", lay.schedule,
                            f"shardlab train runs {', '.join(TRAIN_SCHEDULES)}")
        # cp, HSDP and uneven stages are train's too (issue 17); what it refuses for a
        # MoE (cp, HSDP with ep > 1) the rules mark (plan.rules, R_TRAIN).
        check_rules(model, space, c)
        if c.reason[0] >= 0:
            raise SpecError("layout", text, REASONS[int(c.reason[0])])
    return c
