"""What one measured run buys: the published runs of one stack, anchored on the first.

``shardlab plan --measured-step`` fits the curve's share of the peak to one run the user
measured (:mod:`shardlab.plan.anchor`). This module measures what that buys on the
published runs (:data:`shardlab.plan.published.RUNS`): a **family** is the runs of one
source on one accelerator at one dtype (one software stack and release, as a team's own
runs would be); its first run in the table's order (a rule fixed before any result: no
choosing of the best anchor) is taken as "measured", the share fitted to it, and every
other held-out run of the family priced on the anchored curve beside the catalog's.
Families of one run have nothing to predict and are left out.

``python -m shardlab.plan.published_anchor`` prints the table of ``docs/validation.md``,
"What one measured run buys". The headline held-out figure stays the catalog's: anchoring
uses a measured time of the family, which is the point of the option, not a blind test.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from shardlab.errors import SpecError
from shardlab.plan.anchor import anchor_efficiency, share
from shardlab.plan.efficiency import efficiency_of
from shardlab.plan.published import RUNS, errors, predict
from shardlab.plan.published_run import PublishedRun


@dataclass(frozen=True)
class Family:
    """One family anchored: its ``anchor`` run, the ``field`` fitted from ``catalog`` to
    ``fitted``, and each other held-out run's errors on the catalog's curve and the
    anchored one (predicted / measured - 1)."""

    anchor: PublishedRun
    own: float
    """The anchor run's own error on the catalog's curve."""
    field: str
    catalog: float
    fitted: float
    runs: tuple[PublishedRun, ...]
    zero_shot: tuple[float, ...]
    anchored: tuple[float, ...]


def families(runs: tuple[PublishedRun, ...] = RUNS, by_model: bool = True
             ) -> list[list[PublishedRun]]:
    """The runs grouped by (source, accelerator, dtype), and with ``by_model`` the model
    too, in the table's order; excluded and unverified rows left out, groups of one
    dropped."""
    groups: dict[tuple[str, ...], list[PublishedRun]] = {}
    for r in runs:
        if not r.excluded and r.role != "unverified":
            key = (r.source, r.gpu, r.dtype) + ((r.model.name,) if by_model else ())
            groups.setdefault(key, []).append(r)
    return [g for g in groups.values() if len(g) > 1]


def anchor_family(group: list[PublishedRun]) -> Family | None:
    """``group`` anchored on its first run; None when no other run is held out."""
    first, rest = group[0], [r for r in group[1:] if r.role == "validation"]
    if not rest:
        return None
    field = "fp8_peak_fraction" if first.dtype == "fp8" else "peak_fraction"
    base = efficiency_of(first.accelerator())
    try:
        fitted, _ = anchor_efficiency(lambda e: predict(first, e)["step_seconds"], base,
                                      field, first.measured_step)
    except SpecError:  # no share in the span prices it so: the option refuses, as here
        fitted = base

    return Family(first, float(errors([first])[0]), field, share(base, field),
                  getattr(fitted, field), tuple(rest), tuple(errors(rest)),
                  tuple(errors(rest, fitted)))


def anchored_table(runs: tuple[PublishedRun, ...] = RUNS, by_model: bool = True
                   ) -> tuple[str, float, float, int]:
    """The markdown table (a row per family of :func:`families`, then the total), and the
    mean absolute error of the predicted runs on the catalog's curve and anchored, and
    their count."""
    lines = [f"| family (source, GPUs, dtype{', model' if by_model else ''}) | anchor run "
             "(its catalog error) | share: catalog -> anchored | runs predicted | mean abs. "
             "error: catalog | anchored |",
             "|---|---|---|---|---|---|"]
    zero: list[float] = []
    anch: list[float] = []
    for group in families(runs, by_model):
        fam = anchor_family(group)
        if fam is None:
            continue
        a, own = fam.anchor, fam.own
        z, n = np.abs(fam.zero_shot), np.abs(fam.anchored)
        zero += list(z)
        anch += list(n)
        moved = (f"{fam.field} {fam.catalog:.3f} -> {fam.fitted:.3f}" if fam.fitted !=
                 fam.catalog else f"out of reach: {fam.field} {fam.catalog:.3f} kept")
        model = f"; {a.model.name}" if by_model else ""
        lines.append(f"| {a.source}; {a.gpu}; {a.dtype}{model} | {a.name} ({own:+.1%}) | "
                     f"{moved} | "
                     f"{len(z)} | {z.mean():.1%} | {n.mean():.1%} |")
    mz, ma = float(np.mean(zero)), float(np.mean(anch))
    lines.append(f"| **all** | | | **{len(zero)}** | **{mz:.1%}** | **{ma:.1%}** |")
    return "\n".join(lines), mz, ma, len(zero)


def main() -> int:
    """Print :func:`anchored_table`'s markdown: families of one model, then of one stack."""
    for by_model in (True, False):
        text, zero, anchored, n = anchored_table(by_model=by_model)
        print(f"{'One model' if by_model else 'One stack, any model'}: {n} runs predicted, "
              f"mean absolute error {zero:.1%} on the catalog's curve, {anchored:.1%} "
              f"anchored\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
