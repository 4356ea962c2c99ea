"""A training run as a page: loss curves (and the one-process reference), tokens/s and MFU
over steps, the cost model's predictions beside what the run measured, memory per rank.

It reads the run directory ``shardlab train`` writes (``--log-dir``): ``report.json``, the
whole ``--json`` document, and ``train.jsonl``, one line per step from rank 0; or the step
log alone (a run still training, or stopped), which gives the loss and tokens/s pages. No
torch.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from shardlab.errors import SpecError
from shardlab.report import charts
from shardlab.report.html import Raw, Section, para, table_html, verdict
from shardlab.units import human, human_seconds

REQUIRED = ("model", "layout", "world_size", "losses", "tokens_per_s", "step_seconds",
            "memory_per_rank", "predicted_vs_measured")
STATE_KEYS = (("weights", "params"), ("gradients", "grads"), ("optimizer", "optimizer"))
MAX_REPORT_BYTES = 64 * 2**20
"""report.json larger than this (64 MiB) is refused before it is read: a train report is
a few kB, so a bigger file is something else, which would only be read into memory whole."""
MAX_LINE_BYTES = 64 * 2**10
"""A train.jsonl line longer than this (64 KiB) is refused: a step record is about 200 bytes."""


def load_run(path: str | Path) -> dict[str, Any]:
    """``{"doc": report.json or None, "steps": [train.jsonl records], "dir": folder}`` of a
    run directory, or of a step log alone: a ``train.jsonl`` file (any name), or a folder
    that has a step log but no report yet (a run still training, or one that was stopped).
    SpecError when ``path`` is neither, or its files are not what ``shardlab train`` writes
    (not UTF-8 text, not JSON, not a train report), naming the file."""
    d = Path(path).expanduser()
    hint = ("must be a run directory (`shardlab train --log-dir DIR` writes report.json and "
            "train.jsonl there) or its train.jsonl")
    if d.is_file():
        steps = _read_steps(d, str(path))
        if not steps:
            raise SpecError("run_dir", str(path), f"{hint}; this file has no step records")
        return {"doc": None, "steps": steps, "dir": str(d.parent), "log": str(d)}
    if d.exists() and not d.is_dir():
        raise SpecError("run_dir", str(path), f"{hint}; it is not a regular file or a folder")
    if not d.is_dir():
        raise SpecError("run_dir", str(path), f"{hint}; no such file or folder")
    report = d / "report.json"
    log = d / "train.jsonl"
    if not report.is_file():
        if log.is_file():
            steps = _read_steps(log, str(path))
            if steps:
                return {"doc": None, "steps": steps, "dir": str(d), "log": str(log)}
        raise SpecError("run_dir", str(path), f"{hint}; it has no report.json and no step "
                        "records")
    if report.stat().st_size > MAX_REPORT_BYTES:
        raise SpecError("run_dir", str(path), f"its report.json is {report.stat().st_size:,} "
                        f"bytes; a train report is a few kB (at most {MAX_REPORT_BYTES:,})")
    try:
        doc = json.loads(report.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise SpecError("run_dir", str(path), f"its report.json is not UTF-8 text (byte "
                        f"{e.start} is 0x{e.object[e.start]:02x}): not a train report") from None
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError("run_dir", str(path), f"its report.json cannot be read ({e})") from None
    missing = [k for k in REQUIRED if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise SpecError("run_dir", str(path), "its report.json is not a train report "
                        f"(missing {', '.join(missing)})")
    if not doc["losses"] or not all(isinstance(x, int | float) for x in doc["losses"]):
        raise SpecError("run_dir", str(path), "its report.json has no losses")
    steps = _read_steps(log, str(path)) if log.is_file() else []
    return {"doc": doc, "steps": steps, "dir": str(d), "log": str(log)}


def _read_steps(log: Path, run_dir: str) -> list[dict[str, Any]]:
    """train.jsonl's step records, read a line at a time, each line at most MAX_LINE_BYTES
    (a stray huge or binary file is refused at its first bad line, never read whole);
    SpecError naming the file and the line."""
    steps: list[dict[str, Any]] = []

    def bad(n: int, why: str) -> SpecError:
        return SpecError("run_dir", run_dir, f"{log.name} line {n} {why}: not the step log "
                         "`shardlab train` writes")

    try:
        with log.open("rb") as f:
            n = 0
            while raw := f.readline(MAX_LINE_BYTES + 1):
                n += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise bad(n, f"is longer than {MAX_LINE_BYTES:,} bytes")
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise bad(n, f"is not UTF-8 text (byte 0x{raw[e.start]:02x})") from None
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    float(rec["seconds"]), float(rec["tokens"]), int(rec["step"])
                    float(rec["loss"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    raise bad(n, "is not a step record") from None
                steps.append(rec)
    except OSError as e:
        raise SpecError("run_dir", run_dir, f"{log.name} cannot be read ({e.strerror})") from None
    return steps


def comparison_rows(doc: dict[str, Any], plan: dict[str, Any] | None = None
                    ) -> list[tuple[str, str, str, str]]:
    """(what, predicted, measured, measured / predicted) for every figure the run measured
    and the cost model predicted; with ``plan`` (the planner's layout for this run) its
    step time and MFU too."""
    def ratio(p: float | None, m: float | None) -> str:
        return f"{m / p:.3f}" if p and m is not None else "-"

    pvm = doc["predicted_vs_measured"]
    f = pvm["flops_per_step"]
    rows = [("FLOPs per step, all ranks (counted in the run)", human(f["predicted"], "FLOP"),
             human(f["measured"], "FLOP"), ratio(f["predicted"], f["measured"]))]
    a = pvm.get("activation_bytes_per_microbatch") or {}
    if a.get("predicted") and a.get("measured"):
        rows.append(("activations kept per micro-batch, rank 0 (saved-tensor hooks)",
                     human(a["predicted"], "B"), human(a["measured"], "B"),
                     ratio(a["predicted"], a["measured"])))
    for m in doc["memory_per_rank"]:
        pred = sum(m["predicted"][k] for k, _ in STATE_KEYS)
        got = sum(m["measured"][k] for _, k in STATE_KEYS)
        rows.append((f"rank {m['rank']}: weights + gradients + optimizer bytes",
                     f"{pred:,.0f}", f"{got:,.0f}", ratio(pred, got)))
    for row in doc.get("comm_bytes_per_step", []):
        for kind, label in (("dp", "data-parallel"), ("tp", "tensor-parallel"),
                            ("pp", "pipeline")):
            if kind in row:
                p, g = row[kind]["predicted"], row[kind]["measured"]
                step = doc.get("measured_step")
                rows.append((f"rank {row['rank']}: {label} bytes sent in step {step}",
                             f"{p:,.0f}", f"{g:,.0f}", ratio(p, g)))
    if plan is not None:
        rows.append(("step time (planner, median step measured)",
                     human_seconds(plan["step_seconds"]), human_seconds(doc["step_seconds"]),
                     ratio(plan["step_seconds"], doc["step_seconds"])))
        if doc.get("mfu") is not None and plan.get("mfu"):
            rows.append(("MFU (planner, measured)", f"{plan['mfu']:.1%}", f"{doc['mfu']:.1%}",
                         ratio(plan["mfu"], doc["mfu"])))
    return rows


def per_step(run: dict[str, Any]) -> dict[str, list[float]]:
    """Step numbers and tokens/s of each step from ``train.jsonl`` (empty lists when the run
    left no step log)."""
    steps = run["steps"]
    return {"step": [float(s["step"]) for s in steps],
            "tokens_per_s": [s["tokens"] / s["seconds"] if s["seconds"] > 0 else math.nan
                             for s in steps]}


def run_sections(run: dict[str, Any], prefix: str = "run", plan: dict[str, Any] | None = None
                 ) -> list[Section]:
    """The sections of a run's page; ``prefix`` keeps anchors apart on a shared page."""
    doc = run["doc"]
    if doc is None:
        return log_sections(run, prefix)
    over = Section(f"{prefix}-overview", "Run: what happened")
    parity = ("-" if "max_loss_diff" not in doc else
              Raw(f"{doc['max_loss_diff']:.2e} (tolerance {doc['parity_tolerance']:g}): "
                  + verdict(bool(doc["parity_passed"]))))
    over.add(table_html(("what", "value"), [
        ("model", doc["model"]), ("layout", doc["layout"]),
        ("ranks", doc["world_size"]), ("steps", len(doc["losses"])),
        ("first / last loss", f"{doc['losses'][0]:.4f} / {doc['losses'][-1]:.4f}"),
        ("largest relative loss difference from one process", parity),
        ("tokens/s (median step)", human(doc["tokens_per_s"])),
        ("MFU / HFU", "unknown (no peak: run `shardlab hardware --measure`)"
         if doc.get("mfu") is None else f"{doc['mfu']:.2%} / {doc['hfu']:.2%}"),
        ("run directory", run["dir"]),
    ], left=2))

    loss = Section(f"{prefix}-loss", "Loss")
    xs = list(range(len(doc["losses"])))
    series = {"this run": (xs, doc["losses"])}
    if doc.get("reference_losses"):
        series["one process (reference)"] = (xs, doc["reference_losses"])
    loss.chart(charts.lines(
        f"{prefix}-loss", "Training loss per step"
        + (", with the same model trained on one process (the curves should lie on each "
           "other)." if len(series) > 1 else "."), series, xlabel="step", ylabel="loss",
        styles={"this run": "o-", "one process (reference)": "x--"}, integer_x=True))

    sections = [over, loss]
    ps = per_step(run)
    speed = Section(f"{prefix}-speed", "Throughput")
    if ps["step"]:
        # report.json's MFU = model FLOPs per token x its tokens/s / peak: every step's MFU is
        # its tokens/s times the same constant, so one line with two axes shows both.
        scale = (("MFU (%)", 100 * doc["mfu"] / doc["tokens_per_s"])
                 if doc.get("mfu") is not None and doc["tokens_per_s"] else None)
        speed.chart(charts.lines(
            f"{prefix}-speed", "Tokens/s of each step (rank 0's clock; step 0 includes "
            "warm-up)" + (", and the MFU it means against the peak the run used (right axis)."
                          if scale else "; MFU unknown (no peak)."),
            {"tokens/s": (ps["step"], ps["tokens_per_s"])}, right_scale=scale,
            styles={"tokens/s": "o-"}, xlabel="step", ylabel="tokens/s", integer_x=True))
    else:
        speed.add(para("No train.jsonl in the run directory: no per-step figures.", "note"))
    sections.append(speed)

    pvm = Section(f"{prefix}-pvm", "Predicted vs measured")
    pvm.add(table_html(("what", "cost model", "measured", "measured / predicted"),
                       comparison_rows(doc, plan)))
    sections.append(pvm)

    mem = Section(f"{prefix}-memory", "Memory per rank")
    ranks = doc["memory_per_rank"]
    labels, parts = [], {k: [] for k, _ in STATE_KEYS}
    for m in ranks:
        for which in ("predicted", "measured"):
            labels.append(f"rank {m['rank']} {which}")
            for k, mk in STATE_KEYS:
                parts[k].append(m[which][k if which == "predicted" else mk])
    mem.chart(charts.stacked_bars(
        f"{prefix}-memory", "Bytes of weights, gradients and optimizer state each rank holds "
        "(MB, decimal): the cost model's count beside the tensors' own sizes.", labels, parts,
        horizontal=True, scale=1e6, unit="MB (decimal)"))
    sections.append(mem)
    return sections


def log_sections(run: dict[str, Any], prefix: str = "run") -> list[Section]:
    """The page of a step log alone (no report.json: a run still training, or stopped):
    what the log holds, the loss and the tokens/s of every step as rank 0 wrote them."""
    steps = run["steps"]
    ps = per_step(run)
    losses = [float(s["loss"]) for s in steps]
    finite = [x for x in ps["tokens_per_s"] if math.isfinite(x)]
    later = finite[1:] or finite  # step 0 includes warm-up
    over = Section(f"{prefix}-overview", "Run: what the step log holds")
    over.add(para("No report.json beside this step log (the run is still training, or it "
                  "stopped before its end): predicted-vs-measured figures and memory per rank "
                  "come with the report `shardlab train --log-dir` writes at the end.", "note"))
    over.add(table_html(("what", "value"), [
        ("steps logged", f"{len(steps)} (step {steps[0]['step']} to {steps[-1]['step']})"),
        ("first / last loss", f"{losses[0]:.4f} / {losses[-1]:.4f}"),
        ("tokens/s (median step, step 0 left out)",
         human(statistics.median(later)) if later else "-"),
        ("step log", run["log"]),
    ], left=2))
    loss = Section(f"{prefix}-loss", "Loss")
    loss.chart(charts.lines(f"{prefix}-loss", "Training loss per step (from the step log).",
                            {"this run": (ps["step"], losses)}, xlabel="step", ylabel="loss",
                            styles={"this run": "o-"}, integer_x=True))
    speed = Section(f"{prefix}-speed", "Throughput")
    speed.chart(charts.lines(f"{prefix}-speed", "Tokens/s of each step (rank 0's clock; step 0 "
                             "includes warm-up).", {"tokens/s": (ps["step"], ps["tokens_per_s"])},
                             styles={"tokens/s": "o-"}, xlabel="step", ylabel="tokens/s",
                             integer_x=True))
    return [over, loss, speed]
