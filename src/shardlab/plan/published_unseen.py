"""A stack the curve never saw: each H100 calibration stack left out of the fit in turn.

The H100 curve's share of the peak is fitted on four calibration runs, one per software
stack (:mod:`shardlab.plan.published`: Meta's Llama 3 stack, Megatron-Core, torchtitan,
MosaicML's FSDP). A team on a fifth stack gets a curve fitted on none of its runs. This
module measures what that costs: for each of the four, the share is fitted again on the
other three calibration runs only (:func:`shardlab.plan.published.fit`, the same grid),
and that stack's held-out H100/H200 runs (its framework's; fp8 ones too, on the fp8 curve
the bf16 share sets) are priced on the refitted curve beside the catalog's. A stack is its
runs' ``framework``, or with none named the source (the Llama 3 paper's own stack).

``python -m shardlab.plan.published_unseen`` prints the table of ``docs/validation.md``,
"A stack the curve never saw". Like the anchor's table it is a statement about the
catalog, not a fit: the catalog's curve stays fitted on all four.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from shardlab.config.hardware import get_accelerator
from shardlab.plan.published import curve_runs, errors, fit
from shardlab.plan.published_run import PublishedRun

GPU = "H100 SXM"
"""The curve with calibration runs from several stacks (the A100's are all Megatron-LM's,
Blackwell's one run)."""


@dataclass(frozen=True)
class Unseen:
    """One stack left out: its calibration run, the catalog's share (fitted on all four) and
    the one fitted without it, and its held-out runs' errors on the catalog's curve and on
    the one fitted without it."""

    framework: str | None
    calibration: PublishedRun
    catalog: float
    without: float
    runs: tuple[PublishedRun, ...]
    catalog_errors: tuple[float, ...]
    unseen_errors: tuple[float, ...]


def same_stack(r: PublishedRun, calibration: PublishedRun) -> bool:
    """Whether ``r`` ran on ``calibration``'s stack: its framework, or where none is named
    (the Llama 3 paper's own stack), its source."""
    return r.framework == calibration.framework and (
        calibration.framework is not None or r.source == calibration.source)


def unseen() -> list[Unseen]:
    """Each stack of :data:`GPU`'s calibration runs left out of the fit in turn."""
    cal = curve_runs(GPU)
    stored = get_accelerator(GPU).efficiency
    if stored is None:
        raise ValueError(f"{GPU} has no fitted efficiency curve to leave stacks out of")
    held = [r for r in curve_runs(GPU, "validation") if not r.excluded]
    out = []
    for left in cal:
        eff, _ = fit(GPU, free=("peak_fraction",), runs=[r for r in cal if r is not left])
        runs = [r for r in held if same_stack(r, left)]
        out.append(Unseen(left.framework, left, stored.peak_fraction, eff.peak_fraction,
                          tuple(runs), tuple(errors(runs)), tuple(errors(runs, eff))))
    return out


def unseen_table(rows: list[Unseen]) -> tuple[str, float, float, int]:
    """The markdown table (a row per stack, then all), and the mean absolute error of the
    stacks' held-out runs on the catalog's curve and with their stack unseen, and their
    count."""
    lines = ["| stack left out (its calibration run) | share: all four -> without it | "
             "its held-out H100/H200 runs | mean abs. error: catalog | stack unseen |",
             "|---|---|---|---|---|"]
    lines += [f"| {u.framework or 'Llama 3 (Meta)'} ({u.calibration.name}) | "
              f"{u.catalog:.3f} -> {u.without:.3f} | {len(u.runs)} | "
              f"{np.mean(np.abs(u.catalog_errors)):.1%} | "
              f"{np.mean(np.abs(u.unseen_errors)):.1%} |" for u in rows]
    cat = np.abs(np.concatenate([u.catalog_errors for u in rows]))
    uns = np.abs(np.concatenate([u.unseen_errors for u in rows]))
    mc, mu = float(cat.mean()), float(uns.mean())
    lines.append(f"| **all** | | **{len(cat)}** | **{mc:.1%}** | **{mu:.1%}** |")
    return "\n".join(lines), mc, mu, len(cat)


def main() -> int:
    """Print :func:`unseen_table`'s markdown with its summary line."""
    text, cat, uns, n = unseen_table(unseen())
    print(f"Stack unseen: {n} held-out H100/H200 runs, mean absolute error {cat:.1%} on the "
          f"catalog's curve, {uns:.1%} fitted without their stack\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
