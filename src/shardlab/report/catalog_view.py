"""Terminal view of the model and hardware catalogs."""

from __future__ import annotations

from typing import Any

from shardlab.report.tables import show, table
from shardlab.units import human


def print_models(rows: list[dict[str, Any]]) -> None:
    """One row per catalog model: shape (heads as query/key-value heads), exact parameter
    count, source."""
    show(table("Models", ("name", "style", "L", "d", "heads", "d_ff", "vocab", "context",
                          "params", "active"),
               [(r["name"], r["style"], r["layers"], r["d_model"],
                 f"{r['heads']}/{r['kv_heads']}", r["d_ff"], r["vocab"], r["context"],
                 f"{r['params']:,}",
                 human(r["active_params"])) for r in rows]))
    show(table("Sources", ("name", "source"), [(r["name"], r["source"]) for r in rows], left=2))


def print_hardware(doc: dict[str, Any]) -> None:
    """Accelerators (dense peaks, memory, bandwidth, power, links) and links."""
    accs = doc["accelerators"]
    show(table("Accelerators (dense peaks; memory in decimal GB)",
               ("name", "bf16 TFLOP/s", "fp32 TFLOP/s", "memory", "HBM bw", "power", "intra",
                "inter", "host"),
               [(a["name"], f"{a['peak_flops'].get('bf16', 0) / 1e12:,.1f}",
                 f"{a['peak_flops'].get('fp32', 0) / 1e12:,.1f}",
                 human(a["memory_bytes"], "B"), human(a["memory_bandwidth"], "B/s"),
                 f"{a['power_watts']:.0f} W", a["intra_link"]["name"], a["inter_link"]["name"],
                 (a.get("host_link") or {}).get("name", "-"))
                for a in accs]))
    show(table("Links (one direction)", ("name", "bandwidth", "latency", "source"),
               [(k["name"], human(k["bandwidth"], "B/s"), f"{k['latency'] * 1e6:.0f} µs",
                 k["source"]) for k in doc["links"]], left=1))
    show(table("Sources", ("name", "source"), [(a["name"], a["source"]) for a in accs], left=2))
