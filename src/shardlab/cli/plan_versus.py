"""``shardlab plan --layout A --versus B``: B priced beside A, their ratio, and how far off
the planner's ratio has been on published pairs of the same kind of change
(:mod:`shardlab.plan.choice_kinds`; ``docs/validation.md``, "Choosing between two runs of
one job")."""

from __future__ import annotations

import argparse
from typing import Any

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.hardware import Accelerator
from shardlab.config.layout import SCHEDULES
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.plan.choice_kinds import CHOOSER, kind_of
from shardlab.plan.framework_runs import check_framework_runs
from shardlab.plan.options import policy_for, step_options_for
from shardlab.plan.overlap import Framework
from shardlab.plan.search import STEP_KEYS, layout_candidates, layout_step_keys, parse_layout, plan
from shardlab.plan.space import Space

LAYOUT_FIELDS = ("dp", "tp", "pp", "virtual_stages", "micro_batch", "zero", "sp", "recompute",
                 "schedule", "ep", "etp", "capacity_factor", "cp", "dp_replicate",
                 "stage_layers")
"""A priced layout's fields (``best`` entries) that two layouts may differ in."""


def versus(args: argparse.Namespace, model: ModelShape, acc: Accelerator, space: Space,
           policy: DtypePolicy, dropout: bool, fw: Framework, first: dict[str, Any]
           ) -> dict[str, Any]:
    """The ``versus`` object of ``plan --json``: ``layout`` (B as given), ``best`` (B priced
    as ``--layout`` prices A: its own step-time keys over the framework's), ``ratio`` (B's
    step over A's, ``first``), ``changes`` (field -> [A's, B's]), ``kind`` and ``chooser``
    (the published pairs of that kind: ``pairs``, ``ratio_error``, ``scored``,
    ``agreed``). SpecError for a B that is no layout, one the framework does not run, or
    A itself."""
    text = args.versus
    keys = layout_step_keys(text)
    if not set(parse_layout(text, STEP_KEYS)) - set(keys):
        raise SpecError("versus", text, "must name a layout (dp, tp, pp, micro_batch, zero, "
                        "...), not only step-time keys")
    only = layout_candidates(model, space, text)
    check_framework_runs(fw, int(only.pp[0]), SCHEDULES[int(only.schedule[0])],
                         int(only.dp[0]) * int(only.cp[0]), int(only.zero[0]),
                         int(only.cp[0]), int(only.virtual[0]))
    options = step_options_for(acc, flash=args.attention == "flash",
                               overlap_dp=not args.no_overlap_dp, framework=args.framework,
                               overrides=keys)
    result = plan(model, acc, space, policy_for(policy, keys), top=1, dropout=dropout,
                  options=options, only=only, imbalance=args.routing_imbalance)
    second = result.best[0]
    a_keys, b_keys = layout_step_keys(args.layout), keys
    changes = {k: [first[k], second[k]] for k in LAYOUT_FIELDS if first[k] != second[k]}
    changes.update({k: [a_keys.get(k, "-"), b_keys.get(k, "-")]
                    for k in sorted(set(a_keys) | set(b_keys))
                    if a_keys.get(k) != b_keys.get(k)})
    if not changes:
        raise SpecError("versus", text, "is the layout --layout gives: name another")
    kind = kind_of({k: (str(x), str(y)) for k, (x, y) in changes.items()})
    pairs, error, scored, agreed = CHOOSER[kind]
    return {"layout": text, "best": second,
            "ratio": second["step_seconds"] / first["step_seconds"], "changes": changes,
            "kind": kind, "chooser": {"pairs": pairs, "ratio_error": error,
                                      "scored": scored, "agreed": agreed}}
