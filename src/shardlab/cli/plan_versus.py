"""``shardlab plan --layout A --versus B``: B priced beside A, their ratio, and how far off
the planner's ratio has been on published pairs of the same kind of change
(:mod:`shardlab.plan.choice_kinds`; ``docs/validation.md``, "Choosing between two runs of
one job")."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from shardlab.cli.plan_args import check_layout_against_flags
from shardlab.config.dtypes import DtypePolicy
from shardlab.config.hardware import Accelerator
from shardlab.config.layout import SCHEDULES
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.plan.choice_kinds import CHOOSER, kind_of
from shardlab.plan.framework_runs import check_framework_runs
from shardlab.plan.options import check_trainable, policy_for, step_options_for
from shardlab.plan.overlap import Framework
from shardlab.plan.search import (
    LAYOUT_KEYS,
    STEP_KEYS,
    layout_candidates,
    layout_step_keys,
    parse_layout,
    plan,
)
from shardlab.plan.space import Space
from shardlab.plan.step_inputs import StepOptions

LAYOUT_FIELDS = tuple("virtual_stages" if k == "virtual" else k for k in LAYOUT_KEYS)
"""A priced layout's fields (``best`` entries) that two layouts may differ in: ``--layout``'s
keys, the virtual stages under the entry's name for them."""

OPTION_NAMES = {"loss_bytes": "fused_loss", "grad_reduce_bytes": "reduce_dtype"}
"""Step options under the ``--layout`` key that sets them (the kinds of
:func:`~shardlab.plan.choice_kinds.kind_of` are named by keys)."""


def versus(args: argparse.Namespace, model: ModelShape, acc: Accelerator, space: Space,
           base: DtypePolicy, dropout: bool, fw: Framework, first: dict[str, Any],
           first_options: StepOptions, first_policy: DtypePolicy, strict: bool
           ) -> dict[str, Any]:
    """The ``versus`` object of ``plan --json``: ``layout`` (B as given), ``best`` (B priced
    as ``--layout`` prices A: the same accelerator, curve, job and ``base`` dtype policy,
    B's own step-time keys over the framework's), ``ratio`` (B's step over A's, ``first``),
    ``changes`` (what is priced differently, field -> [A's, B's]: layout fields, step
    options, Adam's bytes), ``kind`` and ``chooser`` (the published pairs of that kind:
    ``pairs``, ``ratio_error``, ``scored``, ``agreed``; null for a kind with none). With
    ``strict`` (a plan whose layouts train runs) B's keys must be trainable too. A
    SpecError naming ``versus`` for a B that is no layout, one the framework does not run,
    or one priced as A is."""
    text = args.versus
    try:
        keys = layout_step_keys(text)
        if not set(parse_layout(text, STEP_KEYS)) - set(keys):
            raise SpecError("layout", text, "must name a layout (dp, tp, pp, micro_batch, "
                            "zero, ...), not only step-time keys")
        check_layout_against_flags(args, False, keys)
        if strict:
            check_trainable(keys)
        only = layout_candidates(model, space, text)
        check_framework_runs(fw, int(only.pp[0]), SCHEDULES[int(only.schedule[0])],
                             int(only.dp[0]) * int(only.cp[0]), int(only.zero[0]),
                             int(only.cp[0]), int(only.virtual[0]))
        options = step_options_for(acc, flash=args.attention == "flash",
                                   overlap_dp=not args.no_overlap_dp,
                                   framework=args.framework, overrides=keys, model=model)
        pol = policy_for(base, keys)
        second = plan(model, acc, space, pol, top=1, dropout=dropout, options=options,
                      only=only, imbalance=args.routing_imbalance).best[0]
    except SpecError as e:
        raise SpecError("versus", text, str(e)) from None
    changes = _changes(first, second, first_options, options, first_policy, pol)
    if not changes:
        raise SpecError("versus", text, "is priced as --layout's layout is: name another")
    kind = kind_of({k: (str(x), str(y)) for k, (x, y) in changes.items()})
    record = CHOOSER.get(kind)
    return {"layout": text, "best": second,
            "ratio": second["step_seconds"] / first["step_seconds"], "changes": changes,
            "kind": kind, "chooser": None if record is None else dict(zip(
                ("pairs", "ratio_error", "scored", "agreed"), record, strict=True))}


def _changes(a: dict[str, Any], b: dict[str, Any], oa: StepOptions, ob: StepOptions,
             pa: DtypePolicy, pb: DtypePolicy) -> dict[str, list[Any]]:
    """What is priced differently between the two layouts: their fields (the schedule and
    virtual stages only with a pipeline), their step options (under the ``--layout`` key
    that sets each; the memory facts follow from the others) and Adam's state bytes."""
    piped = a["pp"] > 1 or b["pp"] > 1
    out: dict[str, list[Any]] = {
        k: [a[k], b[k]] for k in LAYOUT_FIELDS
        if a[k] != b[k] and (piped or k not in ("schedule", "virtual_stages"))}
    da, db = asdict(oa), asdict(ob)
    out.update({OPTION_NAMES.get(k, k): [da[k], db[k]] for k in da
                if k not in ("memory", "fp8_recipe", "fp8_cast_bytes") and da[k] != db[k]})
    if oa.fp8_cast_bytes != ob.fp8_cast_bytes:
        # A recipe is a change where its casts' bytes differ (delayed is Megatron's own).
        out["fp8_recipe"] = [oa.fp8_recipe, ob.fp8_recipe]
    if pa.optimizer_bytes != pb.optimizer_bytes:
        out["optimizer_dtype"] = [pa.optimizer_bytes, pb.optimizer_bytes]
    return out
