"""Terminal view of a training run: loss curve(s), throughput, predicted vs measured."""

from __future__ import annotations

from typing import Any

from shardlab.report.tables import show, table
from shardlab.units import human


def print_train(doc: dict[str, Any]) -> None:
    """Per-step losses (and the one-process reference), then throughput and the cost model."""
    show(f"[bold]model[/bold]: {doc['model']}", f"[bold]layout[/bold]: {doc['layout']} "
         f"({doc['world_size']} ranks); logs in {doc['log_dir']}")
    ref = doc.get("reference_losses")
    cols = ("step", "loss", "grad norm") + (("one process", "rel. diff") if ref else ())
    rows = []
    for i, (loss, norm) in enumerate(zip(doc["losses"], doc["grad_norms"], strict=True)):
        row = [i, f"{loss:.6f}", f"{norm:.4f}"]
        if ref:
            row += [f"{ref[i]:.6f}", f"{abs(loss - ref[i]) / abs(ref[i]):.1e}"]
        rows.append(row)
    show(table("Training", cols, rows))
    f = doc["predicted_vs_measured"]["flops_per_step"]
    rows = [("tokens/s (median step)", human(doc["tokens_per_s"])),
            ("FLOPs per step: cost model", human(f["predicted"], "FLOP")),
            ("FLOPs per step: counted in the run", human(f["measured"], "FLOP")),
            ("measured / predicted", f"{f['ratio']:.4f}")]
    if doc.get("mfu") is not None:
        rows += [("MFU / HFU", f"{doc['mfu']:.1%} / {doc['hfu']:.1%}")]
    show(table("Throughput and FLOPs", ("what", "value"), rows))
    show(table("State bytes per rank: measured vs cost model",
               ("rank", "weights", "gradients", "optimizer", "predicted total"),
               [(m["rank"], f"{m['measured']['params']:,}", f"{m['measured']['grads']:,}",
                 f"{m['measured']['optimizer']:,}", f"{sum(m['predicted'].values()):,.0f}")
                for m in doc["memory_per_rank"]]))
    step = doc.get("measured_step")
    a = doc["predicted_vs_measured"]["activation_bytes_per_microbatch"]
    held = {m["rank"]: m.get("activations", {}).get("in_flight") for m in doc["memory_per_rank"]}
    show(table(f"Activations per micro-batch (step {step}): measured vs cost model",
               ("rank", "measured", "predicted", "ratio", "in flight at peak"),
               [(r["rank"], f"{r['measured']:,}" if r["measured"] else "-",
                 f"{r['predicted']:,.0f}", f"{r['ratio']:.3f}" if r["ratio"] else "-",
                 f"{held.get(r['rank']) or '-'}")
                for r in a.get("per_rank", [])]))
    comm = [(row["rank"], dim, f"{row[dim]['measured']:,.0f}", f"{row[dim]['predicted']:,.0f}",
             f"{row[dim]['measured'] / row[dim]['predicted']:.3f}"
             if row[dim]["predicted"] else "-")
            for row in doc["comm_bytes_per_step"]
            for dim in ("dp", "dp_replicate", "cp", "tp", "pp") if dim in row]
    if comm:
        show(table(f"Bytes sent in step {step}: measured vs cost model",
                   ("rank", "dim", "measured", "predicted", "ratio"), comm))
    if "max_loss_diff" in doc:
        ok = doc["parity_passed"]
        show(f"largest relative loss difference from one process: {doc['max_loss_diff']:.2e} "
             f"(tolerance {doc['parity_tolerance']:g}): "
             + ("[green]pass[/green]" if ok else "[red]FAIL[/red]"))


def print_moe(doc: dict[str, Any]) -> None:
    """A mixture of experts' part of the human view: the expert-parallel bytes per rank
    (``ep``: the all-to-alls; ``edp``: FSDP over the experts' replicas) beside the cost
    model's, and what the routers did in the measured step. Nothing for a dense model."""
    routing = doc.get("routing")
    if not routing:
        return
    rows = [(row["rank"], dim, f"{row[dim]['measured']:,.0f}", f"{row[dim]['predicted']:,.0f}",
             f"{row[dim]['measured'] / row[dim]['predicted']:.3f}"
             if row[dim]["predicted"] else "-")
            for row in doc["comm_bytes_per_step"] for dim in ("ep", "edp") if dim in row]
    step = doc.get("measured_step")
    if rows:
        show(table(f"Expert-parallel bytes sent in step {step}: measured vs cost model",
                   ("rank", "dim", "measured", "predicted", "ratio"), rows))
    layers = ", ".join(f"layer {k} {v['imbalance']:.2f}" for k, v in routing["per_layer"].items())
    show(f"routing in step {step}: imbalance (max / mean expert load) {routing['imbalance']:.2f} "
         f"({layers}); {routing['dropped']:,} of {routing['assignments']:,} assignments "
         f"dropped by capacity ({routing['dropped_share']:.1%})")
