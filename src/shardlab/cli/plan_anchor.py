"""``shardlab plan --measured-step S [--measured-layout L]``: the matmul efficiency curve
anchored on one run the user measured (:mod:`shardlab.plan.anchor`), before the search."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from shardlab.cli.args import positive_float
from shardlab.config.dtypes import DtypePolicy
from shardlab.config.hardware import Accelerator
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.plan.anchor import Anchor, anchor_efficiency, share
from shardlab.plan.efficiency import efficiency_of
from shardlab.plan.options import policy_for, step_options_for
from shardlab.plan.search import layout_candidates, layout_step_keys, plan
from shardlab.plan.space import Space


def add_anchor_args(g: Any) -> None:
    """--measured-step and --measured-layout, in the plan's cluster group."""
    g.add_argument("--measured-step", type=positive_float, metavar="SECONDS",
                   help="seconds per step you measured for one layout of this job on this "
                   "cluster (--measured-layout, else --layout): the planner first fits its "
                   "matmul share of the peak (peak_fraction; fp8_peak_fraction with --dtype "
                   "fp8) so that it prices that layout at the measurement, then plans on "
                   "that curve (JSON: anchor)")
    g.add_argument("--measured-layout", metavar="LAYOUT",
                   help="the layout --measured-step was measured on, in --layout's keys "
                   "(default: --layout); without --layout, its step-time keys (overlap_*, "
                   "reduce_dtype, fp8_params, ...) are the search's too")


def anchored(args: argparse.Namespace, model: ModelShape, acc: Accelerator, space: Space,
             policy: DtypePolicy, dropout: bool) -> tuple[Accelerator, dict | None]:
    """``acc`` with its curve anchored on ``--measured-step`` (and the anchor's record), or
    as given without it. SpecError for a measurement no share can reach, a bad layout, or
    a layout without a step."""
    text = args.measured_layout or args.layout
    if args.measured_step is None:
        if args.measured_layout is not None:
            raise SpecError("measured_layout", args.measured_layout,
                            "needs --measured-step, the seconds per step measured on it")
        return acc, None
    if not text:
        raise SpecError("measured_step", args.measured_step, "needs the layout it was "
                        "measured on: --measured-layout (or --layout)")
    keys = layout_step_keys(text)
    only = layout_candidates(model, space, text)
    pol = policy_for(policy, keys)
    options = step_options_for(acc, flash=args.attention == "flash",
                               overlap_dp=not args.no_overlap_dp, framework=args.framework,
                               overrides=keys)
    field = "fp8_peak_fraction" if pol.is_fp8 else "peak_fraction"

    def step_at(eff: Any) -> float:
        result = plan(model, replace(acc, efficiency=eff), space, pol, top=1, dropout=dropout,
                      options=options, only=only, imbalance=args.routing_imbalance)
        return float(result.best[0]["step_seconds"])

    base = efficiency_of(acc)
    fitted, before = anchor_efficiency(step_at, base, field, args.measured_step)
    record = Anchor(args.measured_step, text, field, share(base, field),
                    getattr(fitted, field), before)
    return replace(acc, efficiency=fitted), record.as_dict()
