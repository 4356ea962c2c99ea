"""``shardlab schedule``: build a pipeline schedule, time it, draw it, compare the kinds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from shardlab.cli.args import nonneg_float, positive_float, positive_int
from shardlab.cli.output import print_json
from shardlab.errors import SpecError
from shardlab.report.schedule_view import print_comparison, print_schedule
from shardlab.schedules.closed_forms import bubble_1f1b, bubble_interleaved, zb_h1_idle, zb_h2_idle
from shardlab.schedules.draw import save_figure, save_trace
from shardlab.schedules.generators import KINDS, build
from shardlab.schedules.simulate import Durations, simulate

KIND_CHOICES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipev",
                "all")


def register(sub: Any) -> None:
    """Add the ``schedule`` sub-command."""
    p = sub.add_parser("schedule", help="pipeline schedules: generate, time, draw, compare",
                       description="Build a pipeline schedule as data, place every action in "
                       "time, and report its bubble and the micro-batches each rank holds.")
    p.add_argument("--kind", required=True, metavar="KIND",
                   help=f"one of {', '.join(KIND_CHOICES)} (all: a table of every kind)")
    p.add_argument("--stages", type=positive_int, required=True, help="pipeline ranks p")
    p.add_argument("--microbatches", type=positive_int, required=True,
                   help="micro-batches per step m")
    p.add_argument("--virtual", type=positive_int,
                   help="model chunks per rank v (default 2 for interleaved, zb-v, dualpipev)")
    p.add_argument("--t-fwd", type=nonneg_float, default=1.0, help="forward time per chunk")
    p.add_argument("--t-bwd", type=nonneg_float, default=1.0,
                   help="input-gradient backward time per chunk (full backward = t-bwd + t-w)")
    p.add_argument("--t-w", type=nonneg_float, default=1.0,
                   help="weight-gradient backward time per chunk")
    p.add_argument("--p2p", type=nonneg_float, default=0.0,
                   help="latency added to every dependency between ranks")
    p.add_argument("--stage-scale", help="comma-separated time factor per stage (imbalance), "
                   "e.g. 1.2,1,1,1.3")
    p.add_argument("--activation-bytes", type=positive_float,
                   help="bytes of one micro-batch's activations in one chunk (peak memory)")
    p.add_argument("--width", type=positive_int, default=100, help="columns of the ASCII view")
    p.add_argument("--png", type=Path, help="write the timeline as PNG")
    p.add_argument("--svg", type=Path, help="write the timeline as SVG")
    p.add_argument("--trace", type=Path, help="write a Chrome trace / Perfetto JSON")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def _scale(text: str | None) -> tuple[float, ...]:
    if text is None:
        return ()
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SpecError("stage-scale", text, "must be comma-separated numbers") from None
    return values


def _summary(t: Any, d: Any, activation_bytes: float | None) -> dict[str, Any]:
    s = t.schedule
    p, m, v = s.pp, s.microbatches, s.virtual_stages
    closed: dict[str, float] = {}
    if s.name in ("gpipe", "1f1b"):
        closed["bubble"] = bubble_1f1b(p, m)
    elif s.name == "interleaved-1f1b":
        closed["bubble"] = bubble_interleaved(p, m, v)
    elif s.name == "zb-h1":
        closed["idle_first_rank"] = zb_h1_idle(p, d.t_f, d.t_b, d.t_w)
    elif s.name == "zb-h2":
        closed["idle_per_rank"] = zb_h2_idle(p, d.t_f, d.t_b, d.t_w)
    doc = {"kind": s.name, "stages": p, "microbatches": m, "virtual": v,
           "actions": s.num_actions, "messages": len(s.messages()),
           "makespan": t.makespan, "bubble": t.bubble, "bubble_per_rank": list(t.bubble_per_rank),
           "peak_inflight": list(t.peak_inflight),
           "closed_form": closed,
           "note": "peak_inflight counts (chunk, micro-batch) activations held; "
                   "closed forms assume uniform costs and no latency"}
    if activation_bytes is not None:
        doc["peak_activation_bytes"] = [k * activation_bytes for k in t.peak_inflight]
    return doc


def run(args: argparse.Namespace) -> int:
    """Build, time and show one schedule, or compare every kind with --kind all."""

    if args.kind not in KIND_CHOICES:
        raise SpecError("kind", args.kind, f"must be one of {', '.join(KIND_CHOICES)}")
    d = Durations(args.t_fwd, args.t_bwd, args.t_w, args.p2p, _scale(args.stage_scale))
    for flag in ("png", "svg", "trace"):
        path = getattr(args, flag)
        if path is not None and not path.parent.resolve().is_dir():
            raise SpecError(flag, str(path), "its folder does not exist")
    if args.png is not None and args.png.suffix.lower() != ".png":
        raise SpecError("png", str(args.png), "must end in .png")
    if args.svg is not None and args.svg.suffix.lower() != ".svg":
        raise SpecError("svg", str(args.svg), "must end in .svg")
    if args.kind == "all":
        return _run_all(args, d, KINDS)
    sched = build(args.kind, args.stages, args.microbatches, args.virtual)
    timing = simulate(sched, d)

    for path in (args.png, args.svg):
        if path is not None:
            save_figure(timing, path)
    if args.trace is not None:
        save_trace(timing, args.trace)
    doc = _summary(timing, d, args.activation_bytes)
    if args.json:
        doc["timeline"] = [
            [{"start": e.start, "end": e.end, "kind": e.action.kind,
              "microbatch": e.action.microbatch, "stage": e.action.stage,
              "chunk": sched.chunk_of_stage[e.action.stage]} for e in ev]
            for ev in timing.events]
        print_json(doc)
        return 0

    print_schedule(timing, doc, args.width)
    return 0


def _run_all(args: argparse.Namespace, d: Any, kinds: tuple[str, ...]) -> int:
    if any(getattr(args, f) is not None for f in ("png", "svg", "trace")):
        raise SpecError("kind", "all", "draws no pictures; name one kind with --png/--svg/--trace")
    rows = []
    for kind in kinds:
        virtual = args.virtual if kind == "interleaved-1f1b" else None
        try:
            timing = simulate(build(kind, args.stages, args.microbatches, virtual), d)
        except SpecError as e:
            rows.append({"kind": kind, "error": str(e)})
            continue
        rows.append(_summary(timing, d, args.activation_bytes))
    if args.json:
        print_json({"stages": args.stages, "microbatches": args.microbatches, "schedules": rows})
        return 0

    print_comparison(rows)
    return 0
