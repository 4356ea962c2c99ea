"""Terminal view of timed pipeline schedules."""

from __future__ import annotations

from typing import Any

from shardlab.report.tables import show, table
from shardlab.schedules.draw import rich_timeline
from shardlab.units import human


def print_schedule(timing: Any, doc: dict[str, Any], width: int) -> None:
    """The coloured timeline, then bubble and peak in-flight per rank."""
    show(f"[bold]{doc['kind']}[/bold]: p={doc['stages']} m={doc['microbatches']} "
         f"v={doc['virtual']}, {doc['actions']} actions, {doc['messages']} p2p messages; "
         f"makespan {doc['makespan']:g}, bubble {doc['bubble']:.2%}")
    show(rich_timeline(timing, width))
    show("[dim]F forward, B backward, I input-gradient, W weight-gradient; "
         "· idle[/dim]")
    rows = [(r, f"{b:.2%}", k) for r, (b, k) in
            enumerate(zip(doc["bubble_per_rank"], doc["peak_inflight"], strict=True))]
    if "peak_activation_bytes" in doc:
        rows = [(*row, human(x, "B")) for row, x in zip(rows, doc["peak_activation_bytes"],
                                                         strict=True)]
    cols = ["rank", "bubble (own span)", "peak in flight"]
    if "peak_activation_bytes" in doc:
        cols.append("peak activations")
    show(table("Per rank", cols, rows))
    for k, v in doc["closed_form"].items():
        show(f"closed form {k}: {v:.4g}")


def print_comparison(rows: list[dict[str, Any]]) -> None:
    """One row per kind: makespan, bubble, worst per-rank bubble, peak in flight."""
    out = []
    for r in rows:
        if "error" in r:
            out.append((r["kind"], "-", "-", "-", "-", r["error"]))
            continue
        out.append((r["kind"], r["virtual"], f"{r['makespan']:g}", f"{r['bubble']:.2%}",
                    f"{max(r['bubble_per_rank']):.2%}",
                    f"{max(r['peak_inflight'])} (rank 0: {r['peak_inflight'][0]})"))
    show(table("Schedules compared (peak in flight in chunk micro-batches)",
               ("kind", "v", "makespan", "bubble", "worst rank's own", "peak in flight"), out))
