"""``shardlab schedule``: build a pipeline schedule, time it, draw it, compare the kinds."""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from shardlab.cli.args import nonneg_float, positive_float, positive_int
from shardlab.cli.output import Vouched, print_json
from shardlab.config.layout import parse_stage_layers
from shardlab.errors import SpecError
from shardlab.report.schedule_view import print_comparison, print_schedule
from shardlab.schedules.closed_forms import (
    bubble_1f1b,
    bubble_interleaved,
    gpipe_makespan,
    zb_h1_idle,
    zb_h2_idle,
)
from shardlab.schedules.draw import MAX_DRAWN_ACTIONS, figure_bytes
from shardlab.schedules.generators import (
    KINDS,
    MAX_ACTIONS,
    MAX_MICROBATCHES,
    MAX_STAGES,
    build,
    check_size,
    default_virtual,
)
from shardlab.schedules.simulate import Durations, Timing, simulate, stage_layer_scale
from shardlab.schedules.stream import FORMATS, timeline, write_actions

KIND_CHOICES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipev",
                "all")
# Bounds on the numbers, so nothing overflows and nothing fills memory: at most 262,144
# actions of at most 1e15 units, each scaled at most 1e6 times, stay far below a float's
# 1.8e308 (beyond it the timeline is inf and NaN); a terminal row is far below 2,000
# columns (the view holds ranks x width cells); 1e18 bytes is an exabyte per micro-batch.
BOUNDS = {"t_fwd": ("t-fwd", 1e15), "t_bwd": ("t-bwd", 1e15), "t_w": ("t-w", 1e15),
          "p2p": ("p2p", 1e15), "activation_bytes": ("activation-bytes", 1e18),
          "width": ("width", 2000)}
MAX_SCALE = 1e6
FILE_FLAGS = ("png", "svg", "trace", "actions_out")
"""The flags that name a file to write (argparse's attribute names)."""


def register(sub: Any) -> None:
    """Add the ``schedule`` sub-command."""
    p = sub.add_parser("schedule", help="pipeline schedules: generate, time, draw, compare",
                       description="Build a pipeline schedule as data, place every action in "
                       "time, and report its bubble and the micro-batches each rank holds.")
    p.add_argument("--kind", required=True, metavar="KIND",
                   help=f"one of {', '.join(KIND_CHOICES)} (all: a table of every kind)")
    p.add_argument("--stages", type=positive_int, required=True,
                   help=f"pipeline ranks p (at most {MAX_STAGES})")
    p.add_argument("--microbatches", type=positive_int, required=True,
                   help=f"micro-batches per step m (at most {MAX_MICROBATCHES:,}; and at most "
                   f"{MAX_ACTIONS:,} actions in all)")
    p.add_argument("--virtual", type=positive_int,
                   help="model chunks per rank v (default 2 for interleaved, zb-v, dualpipev)")
    p.add_argument("--t-fwd", type=nonneg_float, default=1.0, help="forward time per chunk")
    p.add_argument("--t-bwd", type=nonneg_float, default=1.0,
                   help="input-gradient backward time per chunk (full backward = t-bwd + t-w)")
    p.add_argument("--t-w", type=nonneg_float, default=1.0,
                   help="weight-gradient backward time per chunk")
    p.add_argument("--p2p", type=nonneg_float, default=0.0,
                   help="latency added to every dependency between ranks")
    p.add_argument("--stage-scale", help="comma-separated time factor per model chunk "
                   "(imbalance), stages x chunks per rank of them, e.g. 1.2,1,1,1.3")
    p.add_argument("--stage-layers", metavar="N,N,...",
                   help="layers of each model chunk (uneven stages), e.g. 3,1 (or 3+1): a "
                   "chunk's actions take its layers times --t-fwd/--t-bwd/--t-w, which are "
                   "then the times of one layer (times --stage-scale where given)")
    p.add_argument("--activation-bytes", type=positive_float,
                   help="bytes of one micro-batch's activations in one chunk (peak memory)")
    p.add_argument("--width", type=positive_int, default=100, help="columns of the ASCII view")
    p.add_argument("--png", type=Path, help=f"write the timeline as PNG (at most "
                   f"{MAX_DRAWN_ACTIONS:,} actions)")
    p.add_argument("--svg", type=Path, help=f"write the timeline as SVG (at most "
                   f"{MAX_DRAWN_ACTIONS:,} actions)")
    p.add_argument("--trace", type=Path, help="write a Chrome trace / Perfetto JSON (as "
                   "--actions-out FILE.json does, under any file name)")
    p.add_argument("--actions-out", type=Path, metavar="FILE",
                   help="write every action with its times to FILE, streamed rank by rank: "
                   + "; ".join(f"{k}: {v}" for k, v in FORMATS.items()))
    p.add_argument("--actions", action="store_true",
                   help="with --json: add the timeline, every action with its times, on one "
                   "line (large: 10 MB for 131,072 actions)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document: the summary (every action with --actions)")
    p.set_defaults(run=run)


def _check_layers(layers: tuple[int, ...], kind: str, p: int, v: int | None) -> None:
    """One ``--stage-layers`` count >= 1 (at most :data:`MAX_SCALE`) per model chunk of
    ``kind``: stages x chunks per rank."""
    if not layers:
        return
    text = ",".join(map(str, layers))
    if not all(1 <= n <= MAX_SCALE for n in layers):
        raise SpecError("stage_layers", text, f"every stage needs at least one layer (and at "
                        f"most {MAX_SCALE:g})")
    v = default_virtual(kind) if v is None else v
    if len(layers) != p * v:
        raise SpecError("stage_layers", text, f"gives {len(layers)} counts; {kind} on {p} "
                        f"stages x {v} chunk(s) per rank has {p * v} model chunks, one count "
                        "each")


def _scale(text: str | None) -> tuple[float, ...]:
    """``--stage-scale``'s factors; SpecError naming the text as given."""
    if text is None:
        return ()
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SpecError("stage-scale", text, "must be comma-separated numbers") from None
    if not all(0 < x <= MAX_SCALE for x in values):
        raise SpecError("stage-scale", text, f"every factor must be a number in (0, {MAX_SCALE:g}]")
    return values


def _check_bounds(args: argparse.Namespace) -> None:
    """Each number flag within :data:`BOUNDS`."""
    for attr, (flag, limit) in BOUNDS.items():
        value = getattr(args, attr)
        if value is not None and value > limit:
            raise SpecError(flag, value, f"must be <= {limit:g}")


def _check_scale(text: str | None, kind: str, p: int, v: int | None) -> None:
    """One ``--stage-scale`` factor per model chunk of ``kind``: stages x chunks per rank."""
    if text is None:
        return
    v = default_virtual(kind) if v is None else v
    given = len(text.split(","))
    if given != p * v:
        raise SpecError("stage-scale", text, f"gives {given} factors; {kind} on {p} stages "
                        f"x {v} chunk(s) per rank has {p * v} model chunks, one factor each")


def _flag(attr: str) -> str:
    """The flag as typed, without its leading dashes: ``actions_out`` -> ``actions-out``."""
    return attr.replace("_", "-")


def _outputs(args: argparse.Namespace) -> dict[str, Path]:
    """The picture, trace and action files asked for, each checked writable before any work
    (:func:`shardlab.report.html.check_output`): flag -> path."""
    asked = {f: getattr(args, f) for f in FILE_FLAGS if getattr(args, f) is not None}
    if not asked:
        return {}
    out_path = asked.get("actions_out")
    if out_path is not None and out_path.suffix.lower() not in FORMATS:
        raise SpecError("actions-out", str(out_path), "must end in " + " or ".join(
            f"{k} ({v})" for k, v in FORMATS.items()))
    # Imported here: shardlab.report.html loads matplotlib, which the terminal view must not pay.
    from shardlab.report.html import check_output

    out = {f: check_output(path, _flag(f)) for f, path in asked.items()}
    for flag in ("png", "svg"):
        if flag in out and out[flag].suffix.lower() != f".{flag}":
            raise SpecError(flag, str(asked[flag]), f"must end in .{flag}")
    seen: dict[Path, str] = {}
    for flag, path in out.items():
        other = seen.setdefault(path.resolve(), flag)
        if other != flag:
            raise SpecError(_flag(flag), str(asked[flag]),
                            f"is also --{_flag(other)}'s file; give each its own")
    return out


def _write(files: dict[str, Path], timing: Timing) -> None:
    """Draw the pictures first, then write each file whole (a temporary file renamed into
    place, with the umask's mode): pictures from their bytes, traces and action lists
    streamed rank by rank. A write that fails anyway is one line, not a traceback."""
    if not files:
        return
    # Imported here: shardlab.report.html loads matplotlib (0.6 s), which the terminal view
    # and --json must not pay.
    from shardlab.report.html import write_atomic

    pictures = {f: figure_bytes(timing, f) for f in files if f in ("png", "svg")}
    for flag, path in files.items():
        try:
            if flag in pictures:
                write_atomic(path, pictures[flag])
            else:
                _stream_atomic(path, timing, ".json" if flag == "trace" else path.suffix.lower())
        except OSError as e:
            raise SpecError(_flag(flag), str(path), f"cannot be written ({e.strerror})") from None


def _stream_atomic(path: Path, timing: Timing, suffix: str) -> None:
    """:func:`shardlab.report.html.write_atomic`'s steps with the action list written as it
    is made (:func:`shardlab.schedules.stream.write_actions`) rather than held whole: on
    131,072 actions it is 11 MB of JSON lines, 20 MB of Chrome trace."""
    from shardlab.report.html import umask_mode  # loaded already by _write: see there

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write_actions(timing, suffix, f)
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def summary(t: Timing, d: Durations, activation_bytes: float | None,
            stage_layers: tuple[int, ...] = ()) -> dict[str, Any]:
    """The ``--json`` document without the action list: sizes, makespan, bubbles, peaks and
    the papers' closed forms (uniform stages; GPipe's also for unequal ones)."""
    s = t.schedule
    p, m, v = s.pp, s.microbatches, s.virtual_stages
    scale = d.stage_scale or (1.0,) * s.stages
    k = scale[0]  # every chunk's factor, where they are uniform
    closed: dict[str, float] = {}
    if s.name == "gpipe" or (len(set(scale)) == 1 and s.name == "1f1b"):
        forward = [d.t_f * x for x in scale]
        backward = [(d.t_b + d.t_w) * x for x in scale]
        makespan = gpipe_makespan(forward, backward, m)
        if s.name == "gpipe":
            closed["makespan"] = makespan
            closed["bubble"] = 1 - m * (sum(forward) + sum(backward)) / (p * makespan) \
                if makespan else 0.0
        else:
            closed["bubble"] = bubble_1f1b(p, m)
    elif len(set(scale)) == 1:
        if s.name == "interleaved-1f1b":
            closed["bubble"] = bubble_interleaved(p, m, v)
        elif s.name == "zb-h1":
            closed["idle_first_rank"] = zb_h1_idle(p, k * d.t_f, k * d.t_b, k * d.t_w)
        elif s.name == "zb-h2":
            closed["idle_per_rank"] = zb_h2_idle(p, k * d.t_f, k * d.t_b, k * d.t_w)
    doc: dict[str, Any] = {
        "kind": s.name, "stages": p, "microbatches": m, "virtual": v,
        "actions": s.num_actions, "messages": s.num_messages,
        "makespan": t.makespan, "bubble": t.bubble, "bubble_per_rank": list(t.bubble_per_rank),
        "peak_inflight": list(t.peak_inflight),
        "closed_form": closed,
        "note": "peak_inflight counts (chunk, micro-batch) activations held; closed forms "
                "assume no latency, and uniform stages but for GPipe's"}
    if stage_layers:
        doc["stage_layers"] = list(stage_layers)
        doc["stage_forward"] = [d.t_f * x for x in scale]
        doc["stage_backward"] = [(d.t_b + d.t_w) * x for x in scale]
    if activation_bytes is not None:
        doc["peak_activation_bytes"] = [n * activation_bytes for n in t.peak_inflight]
    return doc


def _durations(d: Durations, layers: tuple[int, ...]) -> Durations:
    """``d`` with each chunk's time factor its layers (times its --stage-scale factor)."""
    if not layers:
        return d
    return dataclasses.replace(d, stage_scale=stage_layer_scale(layers, d.stage_scale))


def run(args: argparse.Namespace) -> int:
    """Build, time and show one schedule, or compare every kind with --kind all."""

    if args.kind not in KIND_CHOICES:
        raise SpecError("kind", args.kind, f"must be one of {', '.join(KIND_CHOICES)}")
    _check_bounds(args)
    if args.actions and not args.json:
        raise SpecError("actions", True, "only with --json (it adds every action to the JSON "
                        "document); --actions-out FILE writes them to a file")
    d = Durations(args.t_fwd, args.t_bwd, args.t_w, args.p2p, _scale(args.stage_scale))
    layers = parse_stage_layers(args.stage_layers)
    if args.kind == "all":
        return _run_all(args, d, layers, KINDS)
    if args.kind == "interleaved-1f1b" and args.stages < 2:
        # As a layout: one stage has no pipeline to interleave (its chunks run in turn).
        raise SpecError("stages", args.stages, "must be >= 2 for interleaved-1f1b")
    files = _outputs(args)
    n = check_size(args.kind, args.stages, args.microbatches, args.virtual)
    for flag in ("png", "svg"):
        if flag in files and n > MAX_DRAWN_ACTIONS:
            raise SpecError(flag, str(files[flag]), f"draws at most {MAX_DRAWN_ACTIONS:,} "
                            f"actions; this schedule has {n:,} (--trace has no such limit)")
    _check_scale(args.stage_scale, args.kind, args.stages, args.virtual)
    _check_layers(layers, args.kind, args.stages, args.virtual)
    d = _durations(d, layers)
    sched = build(args.kind, args.stages, args.microbatches, args.virtual)
    timing = simulate(sched, d)
    _write(files, timing)
    doc = summary(timing, d, args.activation_bytes, layers)
    if args.json:
        if args.actions:
            # Clean as it is: simulate refuses a timeline that is not finite, keys are str.
            doc["timeline"] = Vouched(timeline(timing))
        # One line for the action list: json's C encoder runs only without indentation, and
        # the indenting one took 70% of 15 s on 131,072 actions.
        print_json(doc, compact=args.actions)
        return 0

    print_schedule(timing, doc, args.width)
    return 0


def _run_all(args: argparse.Namespace, d: Durations, layers: tuple[int, ...],
             kinds: tuple[str, ...]) -> int:
    if args.actions or any(getattr(args, f) is not None for f in FILE_FLAGS):
        raise SpecError("kind", "all", "draws no pictures and lists no actions; name one kind "
                        "with --png/--svg/--trace/--actions/--actions-out")
    # The smallest kind over the limits refuses the command; a larger one is a row's error.
    check_size("gpipe", args.stages, args.microbatches)
    rows = []
    for kind in kinds:
        virtual = args.virtual if kind == "interleaved-1f1b" else None
        try:
            check_size(kind, args.stages, args.microbatches, virtual)
            _check_scale(args.stage_scale, kind, args.stages, virtual)
            _check_layers(layers, kind, args.stages, virtual)
            kind_d = _durations(d, layers)
            timing = simulate(build(kind, args.stages, args.microbatches, virtual), kind_d)
        except SpecError as e:
            rows.append({"kind": kind, "error": str(e)})
            continue
        rows.append(summary(timing, kind_d, args.activation_bytes, layers))
    if args.json:
        print_json({"stages": args.stages, "microbatches": args.microbatches, "schedules": rows})
        return 0

    print_comparison(rows)
    return 0
