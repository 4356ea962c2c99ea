"""Why a layout does not fit, and the cheapest changes that make it fit.

For one layout (a :class:`~shardlab.config.layout.Layout`) on one accelerator,
:func:`explain_fit` reports the memory of the busiest device by category (weights,
gradients, optimizer state, activations, and a framework's transient peak beyond them),
the capacity it is held against, the binding category, and every single change of one
knob, each with its memory per device, whether it fits, and its predicted step time
beside the current one.

**Binding category.** The one whose removal would lower the peak most: for category c,
``without[c] = max over pipeline ranks of (total_r - c_r)``, and the binding one has the
smallest ``without`` (ties: the larger share of the busiest rank). With one pipeline
stage this is simply the largest category; with several, removing a category can hand
the peak to another rank (activations pile up on rank 0 under 1F1B, the head sits on the
last), and the rank-aware figure says what cutting it could gain at most. When even
``without[binding]`` is over the capacity, no change to that category alone can be
enough, and the advice says so.

**Changes tried**, one knob each, from the given layout (keeping the device count, the
global batch and the sequence length):

* ``zero=1|2|3``: each ZeRO stage above the current one (only when dp > 1);
* ``recompute=selective|full``: each recompute mode above the current one;
* ``micro_batch=b/2``: half the micro-batch (rounded down), twice the micro-batches;
* ``tp=2t dp=d/2``: twice the tensor parallelism within a node, half the data parallelism;
* ``pp=2p dp=d/2``: twice the pipeline stages (same schedule and virtual stages), half
  the data parallelism;
* ``sp=1``: sequence parallelism, when tp > 1;
* ``ep=2e``: twice the expert parallelism (mixture of experts; same devices, the
  experts spread over more of the data-parallel ranks);
* ``cp=2c dp=d/2``: twice the context parallelism, half the data parallelism, when the
  sequence still cuts into 2·cp chunks (activations per rank halve).

Expert parallelism is kept through the others: ep stays (a halved dp must still hold
it), etp follows tp when it was tp, and the capacity factor is the job's. Uneven stages
stay as given (a change of pp keeps the even split); HSDP's replicas stay, and a change
that halves dp below them is ruled out.

A change the model or device count rules out (tp not dividing the heads, more stages
than layers, an odd dp to halve, tp beyond a node, a rule of :func:`make_layout`
checked by :func:`shardlab.plan.space.check_rules`) is not priced; it is listed in
``skipped`` with the reason. When no single change fits, every pair of two (two kinds,
or the same halving/doubling twice) is priced too.

Memory and step time are the planner's own (:func:`shardlab.plan.memory.memory_arrays`
and, rank by rank for the current layout, :func:`~shardlab.plan.memory.rank_memory`;
:func:`shardlab.plan.step_time.step_seconds`, on :func:`shardlab.plan.search.device_of`'s
device), counted with the step options' memory conventions
(:func:`~shardlab.plan.memory.memory_options`): the current figure and each change's are
what ``plan --layout`` with the same ``--framework`` and ``--layout`` keys says for that
layout (a framework's memory facts and transient peak, its selective-recompute
convention, ``offload_layers``, ``recompute_modules``, ``fp8_params``); with no
framework's facts (``budget``) they are the states and saved activations ``budget``
prints. A change's step time is what ``plan --layout`` says (``budget``'s own step time
is its ``--mfu`` assumption, not this model). No formula here is new.
Pure Python and numpy: no torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from shardlab.config.hardware import Accelerator
from shardlab.config.layout import Layout
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.plan.fit_moves import (
    KINDS,
    REPEATABLE,
    Knobs,
    knob_candidates,
    knobs_of,
    moves,
    would_be,
)
from shardlab.plan.framework_runs import check_framework_runs
from shardlab.plan.memory import MemoryOptions, memory_arrays, memory_options, rank_memory
from shardlab.plan.offload import offload_refused
from shardlab.plan.options import step_options_for
from shardlab.plan.overlap import Framework
from shardlab.plan.rules import R_OFFLOAD, REASONS, check_rules
from shardlab.plan.search import device_of
from shardlab.plan.space import Space
from shardlab.plan.step_time import StepOptions, step_seconds

CATEGORIES: tuple[str, ...] = ("weights", "gradients", "optimizer", "activations")
"""The kinds a change of layout is weighed against (the binding one is among them)."""
SHOWN: tuple[str, ...] = (*CATEGORIES, "transient")
"""``by_category``'s keys: the four and the framework's transient peak beyond them
(:mod:`shardlab.plan.memory_peak`; 0 without a framework's memory facts)."""
PAIRS_KEPT = 5
"""Pairs of changes :func:`explain_fit` keeps, fastest first (all of them would be up to a
few dozen rows that say the same)."""


@dataclass(frozen=True)
class FitChange:
    """One changed layout, priced: memory of its busiest device (bytes), whether that is
    within the capacity, its predicted step (seconds) and that over the current step."""

    change: str
    knobs: Knobs
    microbatches: int
    by_category: dict[str, float]
    memory_bytes: float
    fits: bool
    step_seconds: float
    step_ratio: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: change, memory_bytes, fits, step_seconds, step_ratio, by_category and
        the whole changed ``layout`` (dp, tp, pp, virtual_stages, ..., microbatches)."""
        return {"change": self.change, "memory_bytes": self.memory_bytes, "fits": self.fits,
                "step_seconds": self.step_seconds, "step_ratio": self.step_ratio,
                "by_category": self.by_category,
                "layout": {**dataclasses.asdict(self.knobs), "microbatches": self.microbatches}}


@dataclass(frozen=True)
class FitAdvice:
    """What :func:`explain_fit` found (module docstring). Bytes and seconds throughout.

    ``changes``: every single change priced, those that fit fastest first, then the rest
    by memory. ``pairs``: empty when a single change fits; else the pairs that fit,
    fastest first (at most :data:`PAIRS_KEPT`), or, when none does, the pair that comes
    closest (one entry, ``fits`` false). ``skipped``: (change, reason) of each change
    the model, the device count or the node rules out.
    """

    memory_bytes: float
    by_category: dict[str, float]
    stage: int
    capacity: float
    fits: bool
    binding: str
    without: dict[str, float]
    step_seconds: float
    changes: list[FitChange]
    pairs: list[FitChange]
    skipped: list[tuple[str, str]]
    memory_facts: bool = False
    """Whether memory is counted with a framework's memory facts (``plan --framework``)
    rather than as states and saved activations (``budget``)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the ``fit`` object of ``budget --json`` and ``plan --json``)."""
        return {"fits": self.fits, "memory_bytes": self.memory_bytes,
                "capacity": self.capacity, "over_bytes": self.memory_bytes - self.capacity,
                "by_category": self.by_category, "stage": self.stage,
                "binding": self.binding, "without_bytes": self.without,
                "step_seconds": self.step_seconds,
                "changes": [c.as_dict() for c in self.changes],
                "pairs": [c.as_dict() for c in self.pairs],
                "skipped": [{"change": c, "reason": r} for c, r in self.skipped],
                "memory_facts": self.memory_facts}


def explain_fit(model: ModelShape, layout: Layout, acc: Accelerator, *, capacity: float,
                dropout: bool | None = None, options: StepOptions | None = None,
                gpus_per_node: int | None = None, train_only: bool = False,
                imbalance: float = 1.0, framework: Framework | None = None) -> FitAdvice:
    """Memory by category, binding category and priced changes of ``layout`` (module
    docstring).

    ``capacity``: the bytes per device the verdict holds the layout to (``budget``: the
    device's memory; ``plan``: its usable share). ``dropout``: dropout masks in the
    activations (default: the model style's habit, gpt yes, llama no). ``options``: the
    step-time model's options (default :func:`step_options_for` with flash attention);
    its ``flash`` also sets the activation convention. ``gpus_per_node``: how far tp may
    grow (default the accelerator's). ``train_only``: only what ``shardlab train`` runs
    (as ``plan`` on this machine). ``imbalance``: the router's max/mean tokens per
    expert (MoE activations). ``framework``: a change to a layout it does not run
    (:func:`~shardlab.plan.framework_runs.check_framework_runs`) is skipped, with what it
    runs. Raises SpecError for a capacity that is not > 0.
    """
    if not (capacity > 0 and math.isfinite(capacity)):
        raise SpecError("capacity", capacity, "must be a finite number of bytes > 0")
    options = options or step_options_for(acc, flash=True)
    dropout = (model.style == "gpt") if dropout is None else dropout
    node = gpus_per_node or acc.gpus_per_node
    lay = layout

    mem_opt = memory_options(options, dropout=dropout, imbalance=imbalance)
    base = knobs_of(lay)
    ranks = rank_memory(model, knob_candidates([base], lay.global_batch, lay.capacity_factor,
                                               lay.expert_fold), lay.seq, lay.dtype, mem_opt)
    stage = max(range(len(ranks)), key=lambda r: ranks[r]["total"])  # the first busiest
    peak = ranks[stage]["total"]
    now = {c: ranks[stage][c] for c in SHOWN}
    without = {c: max(r["total"] - r[c] for r in ranks) for c in CATEGORIES}
    binding = min(CATEGORIES, key=lambda c: (without[c], -now[c]))

    space = Space(gpus=lay.gpus, global_batch=lay.global_batch, seq=lay.seq,
                  gpus_per_node=node, train_only=train_only,
                  capacity_factor=lay.capacity_factor, expert_fold=lay.expert_fold)
    experts = model.moe.experts if model.moe is not None else 0
    singles = moves(base, node, train_only, experts, lay.seq, lay.expert_fold)
    skipped = [(would_be(kind, base), why) for kind, k, why in singles if k is None]
    tried = [k for _, k, _ in singles if k is not None]
    valid, rejected = _check(model, space, tried, options.offload_layers, framework)
    skipped += [(k.label(base), why) for k, why in rejected]

    step_now, priced = _price(model, lay, acc, base, valid, capacity, mem_opt, options)
    changes = _ordered(priced)
    pairs: list[FitChange] = []
    if not any(c.fits for c in changes):
        pairs = _pairs(model, lay, acc, base, singles, {base, *tried}, space, capacity,
                       mem_opt, options, node, train_only, framework)
    return FitAdvice(peak, now, stage, capacity, peak <= capacity, binding, without,
                     step_now, changes, pairs, skipped, options.memory is not None)


def layout_memory(model: ModelShape, layout: Layout, options: StepOptions, *, dropout: bool,
                  imbalance: float = 1.0) -> dict[str, float]:
    """Bytes on ``layout``'s busiest device as ``shardlab plan --layout`` counts them with
    ``options`` (a framework's selective-recompute convention and memory facts, ``plan
    --framework``): the four categories, ``transient`` (the framework's peak beyond states
    and saved activations: :mod:`shardlab.plan.memory_peak`), ``offloaded_to_host`` and
    ``total``."""
    lay = layout
    c = knob_candidates([knobs_of(lay)], lay.global_batch, lay.capacity_factor, lay.expert_fold)
    mem = memory_arrays(model, c, lay.seq, lay.dtype,
                        memory_options(options, dropout=dropout, imbalance=imbalance))
    out = {n: float(getattr(mem, n)[0]) for n in SHOWN}
    return {**out, "offloaded_to_host": float(mem.offloaded[0]), "total": float(mem.total[0])}


def _check(model: ModelShape, space: Space, states: list[Knobs], offload: int = 0,
           framework: Framework | None = None
           ) -> tuple[list[Knobs], list[tuple[Knobs, str]]]:
    """``states`` split by the planner's rules (with ``offload`` layers offloaded, also
    :data:`~shardlab.plan.rules.R_OFFLOAD`; with ``framework``, what it does not run):
    (valid, [(invalid, the rule it breaks)])."""
    if not states:
        return [], []
    c = knob_candidates(states, space.global_batch, space.capacity_factor, space.expert_fold)
    check_rules(model, space, c)
    c.reason[(c.reason < 0) & offload_refused(c, offload)] = REASONS.index(R_OFFLOAD)
    valid, bad = [], []
    for s, r in zip(states, c.reason.tolist(), strict=True):
        why = REASONS[r] if r >= 0 else _refused(framework, s)
        if why:
            bad.append((s, why))
        else:
            valid.append(s)
    return valid, bad


def _refused(framework: Framework | None, k: Knobs) -> str:
    """Why ``framework`` does not run the layout of ``k`` ("" where it does, or none is
    named)."""
    if framework is None:
        return ""
    try:
        check_framework_runs(framework, k.pp, k.schedule, k.dp * k.cp, k.zero, k.cp,
                             k.virtual_stages)
    except SpecError as e:
        return e.allowed
    return ""


def _price(model: ModelShape, lay: Layout, acc: Accelerator, base: Knobs, states: list[Knobs],
           capacity: float, mem_opt: MemoryOptions, options: StepOptions
           ) -> tuple[float, list[FitChange]]:
    """The current step (seconds) and each of ``states`` priced, all in one pass of the
    planner's memory and step-time arrays (the current layout first)."""
    c = knob_candidates([base, *states], lay.global_batch, lay.capacity_factor, lay.expert_fold)
    mem = memory_arrays(model, c, lay.seq, lay.dtype, mem_opt)
    dev, _ = device_of(acc, lay.dtype, lay.gpus)
    step = step_seconds(model, c, mem, lay.seq, lay.global_batch, lay.dtype, dev,
                        options)["step"]
    total = mem.total
    out = []
    for i, k in enumerate(states, 1):
        out.append(FitChange(k.label(base), k, int(c.microbatches[i]),
                             {n: float(getattr(mem, n)[i]) for n in SHOWN},
                             float(total[i]), bool(total[i] <= capacity), float(step[i]),
                             float(step[i] / step[0])))
    return float(step[0]), out


def _ordered(changes: list[FitChange]) -> list[FitChange]:
    """Those that fit, fastest first (then by memory), then the rest by memory."""
    return sorted(changes, key=lambda c: (not c.fits, c.step_seconds if c.fits else 0.0,
                                          c.memory_bytes))


def _pairs(model: ModelShape, lay: Layout, acc: Accelerator, base: Knobs,
           singles: list[tuple[str, Knobs | None, str]], seen: set[Knobs], space: Space,
           capacity: float, mem_opt: MemoryOptions, options: StepOptions, node: int,
           train_only: bool, framework: Framework | None = None) -> list[FitChange]:
    """Two changes applied one after the other (FitAdvice's ``pairs``): kinds in
    :data:`KINDS` order, so each pair is built once, and the same kind twice only for
    :data:`REPEATABLE` ones; a pair that lands on a layout already priced is not again."""
    two = []
    seen = set(seen)
    for kind, first, _ in singles:
        if first is None:
            continue
        for kind2, second, _ in moves(first, node, train_only,
                                      model.moe.experts if model.moe is not None else 0,
                                      lay.seq, lay.expert_fold):
            later = KINDS.index(kind2) > KINDS.index(kind)
            if second is not None and second not in seen and (
                    later or (kind2 == kind and kind in REPEATABLE)):
                seen.add(second)
                two.append(second)
    valid, _ = _check(model, space, two, options.offload_layers, framework)
    _, priced = _price(model, lay, acc, base, valid, capacity, mem_opt, options)
    fitting = _ordered([c for c in priced if c.fits])
    if fitting:
        return fitting[:PAIRS_KEPT]
    return sorted(priced, key=lambda c: c.memory_bytes)[:1]
