"""A plan as a page: the ranked layouts with their step time split into its parts, what was
rejected and why, and the winner's pipeline timeline.

It draws the document ``shardlab plan --json`` prints
(:func:`shardlab.cli.plan.plan_document`). The timeline is the winner's schedule from
:mod:`shardlab.schedules`, timed with each action's share of the planner's compute time (a
backward costs two forwards), so its makespan reads in the same seconds as the breakdown.
No torch.
"""

from __future__ import annotations

from typing import Any

from shardlab.report import charts
from shardlab.report.html import Section, heading, para, pre, table_html
from shardlab.report.plan_view import accuracy_line, anchor_line, versus_line
from shardlab.schedules.draw import figure_bytes
from shardlab.schedules.generators import build
from shardlab.schedules.simulate import Durations, simulate
from shardlab.units import human, human_bytes, human_seconds

STEP_PARTS = ("compute", "recompute", "tp_comm", "dp_comm", "pp_comm", "ep_comm", "cp_comm",
              "bubble", "optimizer", "overhead", "offload")


def layout_label(b: dict[str, Any]) -> str:
    """``dp2 tp1 pp1 v1 z3 mb4x1 none``: one ranked layout in a line (``ep8 etp1`` after
    pp where the layout splits experts; ``cp4`` after dp with context parallelism, ``hsdp2``
    with HSDP replicas, ``split 7..7`` with uneven stages)."""
    sched = f" {b['schedule']}" if b["pp"] > 1 else ""
    split = b.get("stage_layers") or ()
    sched += f" split {split[0]}..{split[-1]}" if split else ""
    moe = f" ep{b['ep']} etp{b['etp']}" if b.get("ep", 1) > 1 else ""
    cp = f" cp{b['cp']}" if b.get("cp", 1) > 1 else ""
    cp += f" hsdp{b['dp_replicate']}" if b.get("dp_replicate", 1) > 1 else ""
    return (f"dp{b['dp']}{cp} tp{b['tp']} pp{b['pp']}{moe} v{b['virtual_stages']} z{b['zero']}"
            f"{' sp' if b['sp'] else ''} mb{b['micro_batch']}x{b['microbatches']} "
            f"{b['recompute']}{sched}")


def plan_sections(doc: dict[str, Any], prefix: str = "plan") -> list[Section]:
    """The sections of a plan's page; ``prefix`` keeps anchors apart on a shared page."""
    return [_overview(doc, prefix), _ranked(doc, prefix), _rejected(doc, prefix),
            _winner(doc, prefix)]


def _overview(doc: dict[str, Any], prefix: str) -> Section:
    s = Section(f"{prefix}-overview", "Plan: the search")
    e = doc["efficiency"]
    s.add(table_html(("what", "value"), [
        ("model", f"{doc['model']}: {doc['model_shape']}"),
        ("cluster", f"{doc['gpus']} x {doc['gpu']} ({doc['gpus_per_node']} per node), "
                    f"{human(doc['peak_flops_per_device'], 'FLOP/s')} dense {doc['dtype']} "
                    f"each, {human_bytes(doc['usable_memory_per_device'])} usable"),
        ("job", f"global batch {doc['global_batch']} x seq {doc['seq']} = "
                f"{doc['global_batch'] * doc['seq']:,} tokens per step"),
        ("searched", f"{doc['candidates_evaluated']:,} layouts in "
                     f"{human_seconds(doc['seconds'])}: {doc['feasible']:,} fit"),
    ], left=2))
    s.add(para(f"Matmul efficiency {e['peak_fraction']:.3f} x peak x I/(I + "
               f"{e['half_intensity']:g}) at arithmetic intensity I; "
               f"{e['op_overhead'] * 1e6:g} µs per operator; {e['link_fraction']:.0%} of link "
               f"bandwidth. Source: {e['source']}", "note"))
    if doc.get("anchor"):
        line = anchor_line(doc["anchor"])
        s.add(para(line[0].upper() + line[1:] + ".", "note"))
    if doc.get("versus"):
        line = versus_line(doc["versus"])
        s.add(para(line[0].upper() + line[1:] + ".", "note"))
    if doc.get("accuracy") is not None:
        line = accuracy_line(doc["accuracy"], doc["gpu"], doc["dtype"],
                             anchored=bool(doc.get("anchor")))
        s.add(para(line[0].upper() + line[1:] + ".", "note"))
    return s


def _ranked(doc: dict[str, Any], prefix: str) -> Section:
    s = Section(f"{prefix}-ranked", "The fastest layouts")
    best = doc["best"]
    if not best:
        return s.add(para("No layout fits: see the rejections below.", "bad"))
    parts = [k for k in STEP_PARTS if any(b["breakdown"].get(k) for b in best)]
    unit, scale = _time_unit(max(b["step_seconds"] for b in best))
    s.chart(charts.stacked_bars(
        f"{prefix}-steps", f"Predicted step time of each layout ({unit}), split into its "
        "parts; communication and bubble are the exposed part, not hidden behind compute.",
        [f"#{i} {layout_label(b)}" for i, b in enumerate(best, 1)],
        {k: [b["breakdown"].get(k, 0.0) for b in best] for k in parts}, horizontal=True,
        scale=scale, unit=f"step time ({unit})", highlight=0))
    hidden = [k for k in (best[0].get("hidden", {}) if best else {})
              if any(b["hidden"][k] > 5e-4 for b in best)]
    if hidden:
        s.add(table_html(("#", *(f"{k} exposed" for k in hidden),
                              *(f"{k} hidden" for k in hidden)),
                         [(i, *(human_seconds(b["breakdown"][k]) for k in hidden),
                           *(human_seconds(b["hidden"][k]) for k in hidden))
                          for i, b in enumerate(best, 1)]))
        s.add(para("Hidden: communication that overlaps compute (the framework's overlap "
                   "options and the --layout keys overlap_dp, overlap_tp, overlap_pp, "
                   "overlap_ep) and activation copies to host memory behind it "
                   "(offload_layers); it is not in the step time.", "note"))
    moe = bool(doc.get("moe"))
    s.add(table_html(
        ("#", "dp·cp·tp·pp", *(["ep·etp"] if moe else []), "v", "schedule", "zero", "sp",
         "recompute", "mb x m", "step", "tokens/s", "MFU", "memory/device"),
        [(i, f"{b['dp']}·{b.get('cp', 1)}·{b['tp']}·{b['pp']}",
          *([f"{b['ep']}·{b['etp']}"] if moe else []),
          b["virtual_stages"], b["schedule"] if b["pp"] > 1 else "-", b["zero"], int(b["sp"]),
          b["recompute"], f"{b['micro_batch']}x{b['microbatches']}",
          human_seconds(b["step_seconds"]), f"{b['tokens_per_second']:,.0f}", f"{b['mfu']:.1%}",
          human(b["memory_per_device"], "B")) for i, b in enumerate(best, 1)], left=8 + moe))
    return s


def _time_unit(seconds: float) -> tuple[str, float]:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return unit, scale
    return "ns", 1e-9


def _rejected(doc: dict[str, Any], prefix: str) -> Section:
    s = Section(f"{prefix}-rejected", "Rejected layouts")
    rej = sorted(doc["rejected"].items(), key=lambda kv: -kv[1])
    if not rej:
        return s.add(para("Every layout searched fits.", "note"))
    s.chart(charts.bars(f"{prefix}-rejected", f"Layouts dropped, by the first reason found "
                        f"({sum(v for _, v in rej):,} of {doc['candidates_evaluated']:,}).",
                        [k for k, _ in rej], [v for _, v in rej], unit="layouts",
                        colour="#BAB0AC", notes=[f"{v:,}" for _, v in rej]))
    s.add(table_html(("reason", "layouts"), [(k, f"{v:,}") for k, v in rej]))
    return s


def _winner(doc: dict[str, Any], prefix: str) -> Section:
    s = Section(f"{prefix}-winner", "The winner")
    if not doc["best"]:
        return s.add(para("No winner: nothing fits.", "bad"))
    b = doc["best"][0]
    mb = b["memory_breakdown"]
    s.add(para(f"#1 {layout_label(b)}: {human_seconds(b['step_seconds'])} per step, "
               f"MFU {b['mfu']:.1%}, {human(b['memory_per_device'], 'B')} per device."))
    s.add(table_html((f"memory per device (stage {mb.get('stage', 0)})", "decimal"),
                     [(k, human(mb[k], "B")) for k in ("weights", "gradients", "optimizer",
                                                        "activations", "transient",
                                                        "offloaded_to_host")
                      if mb.get(k) or k not in ("transient", "offloaded_to_host")]))
    if b.get("train_command"):
        s.add(heading("Run it on this machine"), pre(b["train_command"]))
    piped = next(((i, x) for i, x in enumerate(doc["best"], 1) if x["pp"] > 1), None)
    if piped is None:
        s.add(para("No layout shown uses a pipeline (pp = 1): there is no timeline to draw.",
                   "note"))
        return s
    i, p = piped
    s.add(heading(f"Pipeline timeline of #{i}" + (" (the winner)" if i == 1 else
                                                  ", the fastest pipelined layout")))
    s.chart(timeline(p, f"{prefix}-timeline"))
    return s


def timeline_timing(b: dict[str, Any]) -> Any:
    """Layout ``b``'s schedule timed in seconds: each forward of one micro-batch on one chunk
    takes the planner's compute (with recompute) on the timed stage / (3 x micro-batches x
    chunks), a backward twice that (its input and weight halves one forward each)."""
    sched = build(b["schedule"], b["pp"], b["microbatches"], b["virtual_stages"])
    work = b["breakdown"]["compute"] + b["breakdown"].get("recompute", 0.0)
    t_f = work / (3 * b["microbatches"] * b["virtual_stages"])
    return simulate(sched, Durations(t_f=t_f, t_b=t_f, t_w=t_f))


def timeline(b: dict[str, Any], name: str) -> charts.Chart:
    """:func:`timeline_timing` drawn by :func:`shardlab.schedules.draw.figure_bytes`."""
    t = timeline_timing(b)

    def draw(fmt: str) -> bytes:
        with charts.style():
            return figure_bytes(t, fmt)

    return charts.Chart(name, f"{b['schedule']} on {b['pp']} ranks, {b['microbatches']} "
                        f"micro-batches, {b['virtual_stages']} chunk(s) per rank: forward F, "
                        "backward B (or its input half I and weight half W); time in seconds, "
                        f"makespan {human_seconds(t.makespan)}, bubble {t.bubble:.1%}.",
                        draw("svg").decode(), lambda: draw("png"))
