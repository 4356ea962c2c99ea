"""``shardlab plan --measured-step S [--measured-layout L]``: the matmul efficiency curve
anchored on one run the user measured (:mod:`shardlab.plan.anchor`), before the search."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from shardlab.cli.args import positive_float
from shardlab.config.dtypes import DtypePolicy
from shardlab.config.hardware import Accelerator
from shardlab.config.layout import SCHEDULES
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.plan.anchor import Anchor, anchor_efficiency, share
from shardlab.plan.efficiency import efficiency_of
from shardlab.plan.framework_runs import check_framework_runs
from shardlab.plan.options import policy_for, step_options_for
from shardlab.plan.overlap import framework as overlap_framework
from shardlab.plan.search import (
    STEP_KEYS,
    is_this_machine,
    layout_candidates,
    layout_step_keys,
    parse_layout,
    plan,
)
from shardlab.plan.space import Space


def add_anchor_args(g: Any) -> None:
    """--measured-step and --measured-layout, in the group ``g``."""
    g.add_argument("--measured-step", type=positive_float, metavar="SECONDS",
                   help="seconds per step you measured for one layout of this job on this "
                   "cluster (--measured-layout, else --layout): the planner first fits its "
                   "matmul share of the peak (peak_fraction; fp8_peak_fraction with --dtype "
                   "fp8) so that it prices that layout at the measurement, then plans on "
                   "that curve (JSON: anchor)")
    g.add_argument("--measured-layout", metavar="LAYOUT",
                   help="the layout --measured-step was measured on, in --layout's keys "
                   "(default: --layout); without --layout (and without --emit-config, "
                   "--dry-run-top), its step-time keys (overlap_*, reduce_dtype, fp8_params, "
                   "...) are the search's too")


def anchored(args: argparse.Namespace, model: ModelShape, acc: Accelerator, space: Space,
             policy: DtypePolicy, dropout: bool, notes: list[str]
             ) -> tuple[Accelerator, dict | None]:
    """``acc`` with its curve anchored on ``--measured-step`` (and the anchor's record), or
    as given without it; a note in ``notes`` when the measured layout does not fit by the
    planner's count. SpecError for a measurement no share can reach, a bad or missing
    layout, or this machine (its curve is measured per thread count)."""
    text = args.measured_layout or args.layout
    if args.measured_step is None:
        if args.measured_layout is not None:
            raise SpecError("measured_layout", args.measured_layout,
                            "needs --measured-step, the seconds per step measured on it")
        return acc, None
    if is_this_machine(acc):
        raise SpecError("measured_step", args.measured_step, "only a catalog "
                        "accelerator's curve is anchored; this machine's is its own "
                        "measurement (shardlab hardware --measure, per thread count)")
    if not text:
        raise SpecError("measured_step", args.measured_step, "needs the layout it was "
                        "measured on: --measured-layout (or --layout)")
    keys = layout_step_keys(text)
    if not set(parse_layout(text, STEP_KEYS)) - set(keys):
        raise SpecError("measured_layout", text, "must name the layout that was measured "
                        "(dp, tp, pp, micro_batch, zero, ...), not only step-time keys")
    # The measured run is priced, never emitted or trained: shardlab train's rules stay off.
    only = layout_candidates(model, replace(space, train_only=False), text)
    # A measured run on a named framework is one that framework runs.
    check_framework_runs(overlap_framework(args.framework), int(only.pp[0]),
                         SCHEDULES[int(only.schedule[0])], int(only.dp[0]) * int(only.cp[0]),
                         int(only.zero[0]), int(only.cp[0]), int(only.virtual[0]))
    pol = policy_for(policy, keys)
    options = step_options_for(acc, flash=args.attention == "flash",
                               overlap_dp=not args.no_overlap_dp, framework=args.framework,
                               overrides=keys, model=model)
    field = "fp8_peak_fraction" if pol.is_fp8 else "peak_fraction"
    entries = []

    def step_at(eff: Any) -> float:
        result = plan(model, replace(acc, efficiency=eff), space, pol, top=1, dropout=dropout,
                      options=options, only=only, imbalance=args.routing_imbalance)
        entries.append(result.best[0])
        return float(result.best[0]["step_seconds"])

    base = efficiency_of(acc)
    fitted, before = anchor_efficiency(step_at, base, field, args.measured_step)
    if not entries[-1]["fits"]:
        notes.append(f"the measured layout \"{text}\" does not fit by the planner's count "
                     f"({entries[-1]['memory_per_device'] / 1e9:.2f} GB per device): the "
                     "anchor holds only if the run you measured is that layout")
    record = Anchor(args.measured_step, text, field, share(base, field),
                    getattr(fitted, field), before, bool(entries[-1]["fits"]))
    return replace(acc, efficiency=fitted), record.as_dict()
