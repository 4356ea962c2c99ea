"""The budget as a page: parameters, memory per device under every ZeRO stage and recompute
mode, FLOPs and days, one layer's operators on the roofline, serving.

Every number comes from :func:`shardlab.estimate.budget.model_budget` (the document
``shardlab budget --json`` prints), called once for the layout asked and once per
(ZeRO stage, recompute mode) for the memory chart; the serving curve from
:mod:`shardlab.estimate.inference`. No torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shardlab.estimate.budget import model_budget
from shardlab.estimate.inference import decode_step
from shardlab.report import charts
from shardlab.report.budget_view import PARTS, inference_rows
from shardlab.report.html import Section, heading, para, table_html
from shardlab.units import human, human_bytes, human_gib, human_seconds

STATE_PARTS = ("weights", "gradients", "optimizer", "activations")
RECOMPUTE_MODES = ("none", "selective", "full")


def budget_document(model: Any, layout: Any, acc: Any, a: Any) -> dict[str, Any]:
    """``model_budget`` of the layout asked, with ``memory_variants``: the busiest device's
    bytes for each ZeRO stage 0-3 and recompute mode, everything else unchanged."""
    doc = model_budget(model, layout, acc, a)
    variants = []
    for r in RECOMPUTE_MODES:
        for z in range(4):
            v = model_budget(model, dataclasses.replace(layout, zero=z, recompute=r), acc, a)
            variants.append({"zero": z, "recompute": r, **v["memory"]["per_device"],
                             "fits": v["memory"]["fits"]})
    doc["memory_variants"] = variants
    return doc


def decode_curve(model: Any, acc: Any, doc: dict[str, Any]) -> list[dict[str, float]]:
    """Per decode batch (powers of two, up to the first at least 4x the largest batch that
    fits, at least 8, at most 2**16): memory per device (weights + KV cache, bytes) and
    tokens/s at the roofline bound."""
    i = doc["inference"]
    top = min(2**16, max(8, 4 * i["max_batch"]))
    out = []
    b = 1
    while True:
        step = decode_step(model, acc, b, i["context"], i["devices"], i["bytes_per_value"],
                           doc["hardware"]["compute_dtype"])
        mem = (i["weights_bytes"] + i["kv_bytes_per_token"] * i["context"] * b) / i["devices"]
        out.append({"batch": b, "memory_per_device": mem, "tokens_per_s": step.tokens_per_s,
                    "bound": step.roofline.bound})
        if b >= top:
            return out
        b *= 2


def budget_sections(model: Any, layout: Any, acc: Any, a: Any, prefix: str = "budget"
                    ) -> tuple[dict[str, Any], list[Section]]:
    """The budget document and the sections of its page; ``prefix`` keeps anchors and chart
    names apart when several reports share one page."""
    doc = budget_document(model, layout, acc, a)
    return doc, [_overview(doc, prefix), _params(doc, prefix), _memory(doc, prefix),
                 _flops(doc, prefix), _roofline(doc, prefix),
                 _inference(doc, decode_curve(model, acc, doc), prefix)]


def _overview(b: dict[str, Any], prefix: str) -> Section:
    m, lay, hw, a = b["model"], b["layout"], b["hardware"], b["assumptions"]
    mem, t = b["memory"], b["time"]
    s = Section(f"{prefix}-overview", "Budget: the answer")
    s.add(table_html(("what", "value"), [
        ("model", f"{m['name']}: {m['describe']}"),
        ("source", m["source"]),
        ("layout", lay["describe"]),
        ("hardware", f"{lay['gpus']} x {hw['name']}, {human(hw['peak_flops'], 'FLOP/s')} dense "
                     f"{hw['compute_dtype']}"
                     + (f" (linear layers fp8, {human(hw['linear_peak_flops'], 'FLOP/s')})"
                        if hw.get("linear_dtype") == "fp8" else "")
                     + f", {human_bytes(hw['memory_bytes'])}, "
                     f"{human(hw['memory_bandwidth'], 'B/s')}"),
        ("parameters", f"{b['params']['total']:,.0f} ({human(b['params']['total'])})"),
        ("memory per device", f"{human(mem['per_device']['total'], 'B')} of "
                              f"{human(mem['capacity'], 'B')}: "
                              + ("fits" if mem["fits"] else "does not fit")),
        ("training", f"{t['train_days']:.1f} days, ${t['cost']:,.0f}, step "
                     f"{human_seconds(t['step_seconds'])}"),
    ], left=2))
    s.add(para(f"Assumptions: MFU {a['mfu']:.0%}, {human(a['tokens'])} training tokens"
               + (" (20 per parameter, Chinchilla)" if a.get("tokens_default") else "")
               + f", ${a['price_per_gpu_hour']:.2f} per device-hour; {a['flops_convention']}.",
               "note"))
    return s


def _params(b: dict[str, Any], prefix: str) -> Section:
    p = b["params"]
    total = p["total"]
    parts = [(k, p[k]) for k in PARTS if p.get(k)]
    s = Section(f"{prefix}-params", "Parameters")
    s.chart(charts.bars(f"{prefix}-params", "Parameters by part of the model (millions).",
                        [k for k, _ in parts], [v / 1e6 for _, v in parts],
                        unit="parameters (millions)",
                        notes=[f"{human(v)} ({100 * v / total:.1f}%)" for _, v in parts]))
    rows = [(k, f"{v:,}", f"{100 * v / total:.1f}%") for k, v in parts]
    rows.append(("total", f"{total:,.0f}", human(total)))
    if p.get("active_per_token", total) != total:
        rows.append(("active per token", f"{p['active_per_token']:,.0f}",
                     human(p["active_per_token"])))
    rows.append(("per device (busiest rank)", f"{p['per_device']:,.0f}", human(p["per_device"])))
    s.add(table_html(("part", "count", "share"), rows))
    return s


def _memory(b: dict[str, Any], prefix: str) -> Section:
    mem, lay = b["memory"], b["layout"]
    s = Section(f"{prefix}-memory", "Memory per device")
    variants = b["memory_variants"]
    labels = [f"ZeRO-{v['zero']}, recompute {v['recompute']}" for v in variants]
    here = next((k for k, v in enumerate(variants)
                 if v["zero"] == lay["zero"] and v["recompute"] == lay["recompute"]), None)
    s.chart(charts.stacked_bars(
        f"{prefix}-memory", "The busiest device's memory (GB, decimal) for each ZeRO stage and "
        "recompute mode on this layout; the outlined bar is the layout asked, the dashed line "
        "the device's capacity.", labels,
        {k: [v[k] or 0.0 for v in variants] for k in STATE_PARTS}, horizontal=True, scale=1e9,
        unit="GB per device (decimal)", limit=mem["capacity"],
        limit_label=f"capacity {human(mem['capacity'], 'B')}", highlight=here))
    d = mem["per_device"]
    rows = [(k, human(d[k], "B"), human_gib(d[k])) for k in STATE_PARTS]
    rows += [("total", human(d["total"], "B"), human_gib(d["total"])),
             ("capacity", human(mem["capacity"], "B"), human_gib(mem["capacity"]))]
    verdict = "fits" if mem["fits"] else "does not fit"
    s.add(heading(f"The layout asked ({verdict})"), table_html(("what", "decimal", "binary"), rows))
    s.add(para(f"Activations: {human_bytes(mem['activations_per_layer'])} per layer per "
               f"micro-batch x {mem['inflight_microbatches']:g} in flight on stage "
               f"{mem['peak_stage']} (the busiest).", "note"))
    stages = mem["per_stage"]
    if len(stages) > 1:
        s.chart(charts.stacked_bars(
            f"{prefix}-stages", "Memory of each pipeline stage (GB, decimal): the first stages "
            "hold more micro-batches in flight.", [f"stage {x['stage']}" for x in stages],
            {k: [x[k] for x in stages] for k in STATE_PARTS}, scale=1e9,
            unit="GB per device (decimal)", limit=mem["capacity"], limit_label="capacity"))
    z = mem["by_zero_stage"]
    s.add(heading("Model states by ZeRO stage (decimal)"),
          table_html(("stage", "weights", "gradients", "optimizer", "total"),
                     [(f"ZeRO-{k}", human(v["weights"], "B"), human(v["gradients"], "B"),
                       human(v["optimizer"], "B"), human(v["total"], "B"))
                      for k, v in z.items()]))
    return s


def _flops(b: dict[str, Any], prefix: str) -> Section:
    f, t, c = b["flops"], b["time"], b["comm"]
    s = Section(f"{prefix}-flops", "FLOPs, days and money")
    s.add(table_html(("what", "FLOPs"), [
        ("forward per token", human(f["forward_per_token"], "FLOP")),
        ("train per token (model, 3x forward)", human(f["train_per_token"], "FLOP")),
        ("train per token with recompute (hardware)", human(f["hardware_train_per_token"],
                                                            "FLOP")),
        ("per optimizer step (model)", human(f["per_step"], "FLOP")),
        ("whole run, exact (model)", human(f["train_total"], "FLOP")),
        ("whole run, 6ND", human(f["train_6nd"], "FLOP")),
    ]))
    s.add(table_html(("what", "value"), [
        ("step time", human_seconds(t["step_seconds"])),
        ("throughput", human(t["tokens_per_s"], "tokens/s")),
        ("MFU / HFU (with recompute)", f"{t['mfu']:.1%} / {t['hfu']:.1%}"),
        ("wall time", f"{t['train_days']:.1f} days"),
        ("device-hours", human(t["gpu_hours"])),
        ("cost", f"${t['cost']:,.0f}"),
        ("energy (board power)", f"{t['energy_kwh'] / 1000:,.1f} MWh"),
        ("data-parallel bytes sent per step", human(c["dp_bytes_per_step"], "B")),
        ("tensor-parallel bytes sent per step", human(c["tp_bytes_per_step"], "B")),
        ("pipeline bytes sent per step", human(c["pp_bytes_per_step"], "B")),
        *([("expert-parallel all-to-all bytes sent per step", human(c["ep_bytes_per_step"], "B")),
           (f"all-to-alls of one step ({c['ep_link']})", human_seconds(c["ep_alltoall_seconds"]))]
          if c.get("ep_bytes_per_step") else []),
        *([("context-parallel K/V bytes sent per step", human(c["cp_bytes_per_step"], "B")),
           (f"K/V collectives of one step ({c['cp_link']})", human_seconds(c["cp_seconds"]))]
          if c.get("cp_bytes_per_step") else []),
        *([(f"data-parallel bytes across HSDP replicas ({c['dp_replica_link']})",
            human(c["dp_replica_bytes_per_step"], "B"))]
          if c.get("dp_replica_bytes_per_step") else []),
        (f"one gradient all-reduce ({c.get('dp_replica_link', c['dp_link'])})",
         human_seconds(c["dp_allreduce_seconds"])),
    ]))
    return s


def _roofline(b: dict[str, Any], prefix: str) -> Section:
    ops, hw, lay = b["operators"], b["hardware"], b["layout"]
    s = Section(f"{prefix}-roofline", "One layer's operators on the roofline")
    groups = {
        f"training (batch {lay['micro_batch']} x {lay['seq']} tokens)":
            [(o["name"], o["intensity"], o["flops"] / o["seconds"]) for o in ops["train"]],
        f"decode (batch {b['inference']['batch']}, context {b['inference']['context']})":
            [(o["name"], o["intensity"], o["flops"] / o["seconds"]) for o in ops["decode"]],
    }
    s.chart(charts.roofline(
        f"{prefix}-roofline", f"{hw['name']}: {human(hw['peak_flops'], 'FLOP/s')} dense "
        f"{hw['compute_dtype']}, {human(hw['memory_bandwidth'], 'B/s')}. Each point is one "
        "unfused forward operator at its lower bound; numbers match the table's rows.",
        hw["peak_flops"], hw["memory_bandwidth"], groups))
    rows = []
    for k, (tr, de) in enumerate(zip(ops["train"], ops["decode"], strict=True), 1):
        rows.append((k, tr["name"], tr["kind"], human(tr["flops"]), f"{tr['intensity']:.1f}",
                     human_seconds(tr["seconds"]), tr["bound"], f"{de['intensity']:.1f}",
                     human_seconds(de["seconds"]), de["bound"]))
    s.add(table_html(("#", "operator", "kind", "FLOPs (train)", "FLOP/B", "time", "bound",
                      "FLOP/B (decode)", "time", "bound"), rows, left=3,
                     caption="~ marks approximate per-element FLOP counts."))
    return s


def _inference(b: dict[str, Any], curve: list[dict[str, float]], prefix: str) -> Section:
    i = b["inference"]
    s = Section(f"{prefix}-inference", "Serving: KV cache and decode")
    xs = [c["batch"] for c in curve]
    s.chart(charts.lines(
        f"{prefix}-decode", f"Decode with tensor parallel over {i['devices']} device(s), "
        f"context {i['context']}: memory per device (weights + KV cache, GB decimal, left) and "
        "tokens/s at the roofline bound (right) against the batch decoded at once.",
        {"memory per device (GB)": (xs, [c["memory_per_device"] / 1e9 for c in curve])},
        right={"decode tokens/s": (xs, [c["tokens_per_s"] for c in curve])},
        styles={"memory per device (GB)": "o-", "decode tokens/s": "s--"},
        xlabel="decode batch (sequences)", ylabel="GB per device", right_label="tokens/s",
        logx=True, limit=b["hardware"]["memory_bytes"] / 1e9, limit_label="capacity"))
    s.add(table_html(("what", "value"), inference_rows(i),
                     caption="Roofline lower bounds; communication between tensor-parallel "
                     "devices left out."))
    return s
