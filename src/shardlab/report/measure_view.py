"""Terminal view of ``shardlab hardware --measure``: a progress bar over its phases, one line
per finished phase with its figure (on stderr, so ``--json`` keeps stdout to one document),
and the stored figures as a table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shardlab.calibrate.budget import Phase, Phases
from shardlab.report.tables import show, table
from shardlab.units import human, human_bytes


@contextmanager
def measure_progress(phases: int) -> Iterator[Phases]:
    """A :class:`Phases` that shows a bar over ``phases`` phases on stderr and prints each
    finished phase's line above it (plain lines, no bar, where stderr is not a terminal)."""
    console = Console(stderr=True, highlight=False)
    with Progress(TextColumn("measuring {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total} phases"), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("", total=phases)

        def begin(p: Phase) -> None:
            bar.update(task, description=f"{p.name} (budget {p.budget:.1f} s)")

        def end(p: Phase) -> None:
            bar.console.print(f"  {p.name:<13} {p.seconds:5.1f} s  {p.figure}", markup=False,
                              soft_wrap=True)
            bar.advance(task)

        yield Phases(on_begin=begin, on_end=end)


def print_measurement(doc: dict[str, Any], path: str) -> None:
    """The stored measurement: peaks with their kernels, bandwidth, memory, the 2-rank
    runtime's fits, where it was stored."""
    bf16, fp32 = doc["peak_flops"]["bf16"], doc["peak_flops"]["fp32"]
    sides = doc.get("peak_matmul_n", {})
    kernels = doc.get("kernels", {})
    bf16_note = (f"x{bf16 / fp32:.3f} fp32: emulated kernel, no native bf16 on this CPU; "
                 "fp32 is the fast path here" if kernels.get("bf16") == "emulated"
                 else f"x{bf16 / fp32:.2f} fp32")
    rows = [("fp32 matmul", f"{fp32 / 1e12:,.3f} TFLOP/s (n = {sides.get('fp32', '?')})"),
            ("bf16 matmul", f"{bf16 / 1e12:,.4f} TFLOP/s (n = {sides.get('bf16', '?')}, "
                            f"{bf16_note})"),
            ("memory bandwidth", f"{doc['memory_bandwidth'] / 1e9:,.1f} GB/s (read + write)"),
            ("copy rate", human(doc["copy_bandwidth"], "B/s")),
            ("memory", human_bytes(doc["memory_bytes"])),
            ("power", "unknown (0 W: energy estimates are 0)"),
            ("threads", str(doc["threads"])),
            ("torch", doc["torch"])]
    rows += runtime_rows(doc.get("runtime"))
    spent = sum(p["seconds"] for p in doc.get("phases", []))
    rows.append(("phases", f"{len(doc.get('phases', []))}, {spent:.1f} s in all"))
    rows.append(("stored in", path))
    show(table(f"{doc['name']}: best runs, {doc['seconds']:g} s budget (+ the 2-rank runtime)",
               ("figure", "value"), rows, caption=doc["method"], left=2))


def runtime_rows(rt: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Table rows of the measured runtime: each collective's fit, each style's fixed costs."""
    if not rt:
        return []
    rows = [(f"gloo {name.replace('_', '-')}",
             f"{human(c['bandwidth'], 'B/s')}, {c['latency'] * 1e3:.2f} ms latency "
             f"({rt['world']} ranks)") for name, c in rt["collectives"].items()]
    for style, o in rt["overheads"].items():
        rows.append((f"fixed cost, {style}",
                     f"{o['per_step'] * 1e3:.1f} ms/step + {o['per_layer_step'] * 1e3:.1f} "
                     f"ms/layer + {o['per_microbatch'] * 1e3:.1f} ms/micro-batch + "
                     f"{o['per_layer'] * 1e3:.1f} ms/layer/micro-batch"))
    return rows
