"""Terminal view of a simulated run: checks, predicted vs counted bytes, state per device."""

from __future__ import annotations

from typing import Any

from shardlab.report.tables import show, table
from shardlab.units import human


def print_simulation(doc: dict[str, Any]) -> None:
    """Checks (value, tolerance, pass), bytes sent per device and kind, bytes held."""
    show(f"[bold]model[/bold]: {doc['model']}", f"[bold]layout[/bold]: {doc['layout']} "
         f"({doc['devices']} virtual devices)")
    show(table("Losses", ("step", "simulated", "one device"),
               [(i, f"{a:.8f}", f"{b:.8f}") for i, (a, b) in
                enumerate(zip(doc["losses"], doc["reference_losses"], strict=True))]))
    show(table("Checks", ("check", "value", "tolerance", "result"),
               [(c["name"], f"{c['value']:.3g}", f"{c['tolerance']:.3g}",
                 "[green]pass[/green]" if c["passed"] else "[red]FAIL[/red]")
                for c in doc["checks"]]))
    rows = []
    for kind, v in doc["comm"].items():
        counted, predicted = v["counted_bytes"], v["predicted_bytes"]
        if not any(counted) and not any(predicted):
            continue
        for rank, (c, p, t) in enumerate(zip(counted, predicted, v["seconds"], strict=True)):
            rows.append((kind, rank, f"{c:,.0f}", f"{p:,.0f}", human(c, "B"),
                         f"{t * 1e6:.1f} µs" if t else "-"))
    show(table("Bytes sent per device in a step: counted vs cost model",
               ("kind", "device", "counted", "predicted", "", "alpha-beta time"), rows))
    show(table("Bytes held per device after a step: counted vs cost model (ZeRO)",
               ("device", "weights", "gradients", "optimizer", "predicted total"),
               [(s["rank"], f"{s['counted']['weights']:,}", f"{s['counted']['gradients']:,}",
                 f"{s['counted']['optimizer']:,}", f"{sum(s['predicted'].values()):,.0f}")
                for s in doc["state_bytes"]]))
    verdict = "[green]all checks pass[/green]" if doc["passed"] else "[red]a check failed[/red]"
    show(verdict)
