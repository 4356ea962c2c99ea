"""Terminal view of a dry run: the busiest role's memory beside the cost model, every
role's peak, bytes per mesh dim, and the fit verdict."""

from __future__ import annotations

from typing import Any

from shardlab.report.fit_view import print_fit
from shardlab.report.tables import show, table
from shardlab.units import human

_ROWS = (("params", "weights"), ("grads", "gradients"), ("optimizer", "optimizer state"),
         ("activations", "activations saved"), ("activations_tracked", "activations held"),
         ("temporaries", "temporaries"), ("peak_bytes", "peak"))


def _bytes(x: float | None) -> str:
    return "-" if x is None else human(x, "B")


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def at_peak(role: dict[str, Any], key: str) -> float | None:
    """The row's figure in the breakdown at the peak (the saved bytes have none)."""
    if key == "peak_bytes":
        return role["peak_bytes"]
    if key == "activations":
        return None
    return role["by_category"]["activations" if key == "activations_tracked" else key]


def print_dryrun(doc: dict[str, Any]) -> None:
    """Everything a dry run found, in tables."""
    show(f"[bold]model[/bold]: {doc['model']}",
         f"[bold]layout[/bold]: {doc['layout']} ({doc['gpus']} ranks)",
         f"dry-ran rank(s) {', '.join(map(str, doc['roles_run']))} on fake tensors in "
         f"{doc['seconds']:.1f} s")
    busiest = doc["roles"][0]
    moment = busiest["peak_at"]
    show(table(f"Rank {busiest['rank']} (pp {busiest['pp_rank']}, the busiest): cost model "
               "vs dry run", ("", "predicted", "dry run", "dry run / predicted",
                              "at the peak"),
               [(label, _bytes(busiest["predicted"].get(key, busiest["predicted"].get(
                   "activations"))), _bytes(busiest["measured"][key]),
                 _ratio(busiest["ratio"][key]),
                 _bytes(at_peak(busiest, key)))
                for key, label in _ROWS if key in busiest["measured"]]))
    show(f"  peak in the {moment['phase'] or 'step'}"
         + (f", inside {moment['module']}" if moment["module"] else "")
         + "; weights, gradients and optimizer state: what the rank holds after its "
           "backward; activations saved: for backward, x the micro-batches in flight; held: "
           "the step's largest activation figure (also a stage's outputs, the loss's inputs)")
    if len(doc["roles"]) > 1:
        show(table("Every role", ("rank", "pp", "stages", "layers", "peak", "predicted",
                                  "ratio"),
                   [(r["rank"], r["pp_rank"], ",".join(map(str, r["stages"])), r["layers"],
                     _bytes(r["peak_bytes"]), _bytes(r["predicted"]["peak_bytes"]),
                     _ratio(r["ratio"]["peak_bytes"])) for r in doc["roles"]]))
    dims = busiest["by_dim"]
    if dims:
        show(table(f"Bytes sent per step by rank {busiest['rank']}",
                   ("dim", "predicted", "dry run", "ratio"),
                   [(d, f"{v['predicted']:,.0f}", f"{v['measured']:,.0f}",
                     _ratio(v["measured"] / v["predicted"] if v["predicted"] else None))
                    for d, v in dims.items()]))
    show(f"FLOPs of rank {busiest['rank']}'s step: {human(doc['flops'], 'FLOP')}")
    fit = doc.get("fit")
    if fit is not None:
        verdict = "fits" if fit["fits"] else "does NOT fit"
        show(f"[bold]{doc['gpu']}[/bold]: {verdict}: peak {_bytes(doc['peak_bytes'])} + "
             f"CUDA context {_bytes(fit['allowance_bytes'])} = {_bytes(fit['needed_bytes'])} "
             f"of {_bytes(fit['capacity_bytes'])} (headroom {_bytes(fit['headroom_bytes'])}); "
             f"the cost model says it {'fits' if fit['predicted_fits'] else 'does not fit'}")
    show("  not seen by the trackers: " + "; ".join(doc["unseen"]))
    advice = doc.get("fit_advice")
    if advice is not None:
        by = doc["by_category"]
        b = advice["dry_run_binding"]
        show(f"[bold]What binds in the dry run[/bold]: {b}, {_bytes(by[b])} of the "
             f"{_bytes(doc['peak_bytes'])} peak; the cost model's changes follow")
        print_fit(advice)
