"""Terminal view of fit advice: the ``fit`` object of ``budget --json`` / ``plan --json``
(:meth:`shardlab.plan.fit.FitAdvice.as_dict`), shown when a layout does not fit."""

from __future__ import annotations

from typing import Any

from shardlab.report.tables import show, table
from shardlab.units import human, human_seconds


def _rows(changes: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """(change, memory/device, fits, step, vs now) per change, as the document orders them."""
    return [(c["change"], human(c["memory_bytes"], "B"),
             "[green]yes[/green]" if c["fits"] else "[red]no[/red]",
             human_seconds(c["step_seconds"]), f"{c['step_ratio']:.2f}x") for c in changes]


def print_fit(fit: dict[str, Any]) -> None:
    """Print what binds, each single change priced, the pairs when no single one fits, and
    what was not tried and why."""
    b = fit["binding"]
    over = fit["memory_bytes"] - fit["capacity"]
    show(f"[bold]What binds[/bold]: {b}, {human(fit['by_category'][b], 'B')} of "
         f"{human(fit['memory_bytes'], 'B')} on stage {fit['stage']} (the busiest); "
         f"{human(over, 'B')} over {human(fit['capacity'], 'B')}")
    rest = fit["without_bytes"][b]
    if rest > fit["capacity"]:
        # Cutting the binding category cannot be enough on its own: say so up front.
        show(f"  with no {b} at all it would still hold {human(rest, 'B')}: other "
             "categories must shrink too")
    columns = ("change", "memory/device", "fits", "step", "vs now")
    if fit["changes"]:
        show(table("To make it fit: one change", columns, _rows(fit["changes"])))
    if fit["pairs"]:
        title = ("No single change fits; pairs that do" if fit["pairs"][0]["fits"] else
                 "No single change or pair fits; the closest pair")
        show(table(title, columns, _rows(fit["pairs"])))
    transient = fit["by_category"].get("transient", 0.0)
    counted = ("as `plan` counts it with the framework's memory facts (its transient peak "
               f"{human(transient, 'B')} as given)" if fit.get("memory_facts") else
               "states and saved activations, as `budget` counts them")
    show(f"  step: the planner's model (as `plan`), {human_seconds(fit['step_seconds'])} as "
         f"given; memory: {counted} (decimal)")
    if fit["skipped"]:
        show("  not tried: " + "; ".join(f"{s['change']} ({s['reason']})"
                                         for s in fit["skipped"]))
