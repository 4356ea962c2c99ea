"""Pictures of a timed schedule: ASCII rows in the terminal, PNG/SVG.

Ranks are rows, time runs left to right; forward F, backward B (or its input half I)
and weight-gradient W each have a colour. Files are returned as bytes, never written
here: the command line checks the path first and writes them whole
(:func:`shardlab.report.html.write_atomic`). The Chrome trace, a file with every action,
is :mod:`shardlab.schedules.stream`'s.
"""

from __future__ import annotations

import io
from typing import Any

from rich.text import Text

from shardlab.schedules.simulate import Timing

COLOURS = {"F": "#4C78A8", "B": "#54A24B", "I": "#72B7B2", "W": "#F2A93B"}
# PNG and SVG draw at most this many actions: on the widest figure (24 inches at 120 dpi)
# more leave a bar a pixel or two wide, and drawing 100,000 took half a minute. The Chrome
# trace, which Perfetto zooms, has no such limit.
MAX_DRAWN_ACTIONS = 20_000
RICH_STYLES = {"F": "bold white on blue", "B": "bold white on green", "I": "black on cyan",
               "W": "black on yellow"}


def ascii_rows(t: Timing, width: int = 100) -> list[list[tuple[str, str | None]]]:
    """Per rank, a row of (character, kind) cells: the action's label where it fits, its kind
    letter elsewhere, ``·`` when idle. ``width`` columns span the makespan."""
    scale = width / t.makespan if t.makespan else 1.0
    rows = []
    for ev in t.events:
        row: list[tuple[str, str | None]] = [("·", None)] * width
        for e in ev:
            a, b = round(e.start * scale), max(round(e.end * scale), round(e.start * scale) + 1)
            label = f"{e.action.kind}{e.action.microbatch}"
            cells = (label + e.action.kind * (b - a))[: b - a] if b - a > len(label) else (
                e.action.kind * (b - a))
            for i, ch in enumerate(cells):
                if a + i < width:
                    row[a + i] = (ch, e.action.kind)
        rows.append(row)
    return rows


def ascii_timeline(t: Timing, width: int = 100) -> str:
    """Plain-text timeline, one line per rank (``r0 |F0F·F1...|``)."""
    return "\n".join(f"r{r:<3}|{''.join(c for c, _ in row)}|"
                     for r, row in enumerate(ascii_rows(t, width)))


def rich_timeline(t: Timing, width: int = 100) -> Any:
    """The same timeline as a rich ``Text`` with a colour per kind."""
    out = Text()
    for r, row in enumerate(ascii_rows(t, width)):
        out.append(("\n" if r else "") + f"r{r:<3}|")
        for ch, kind in row:
            out.append(ch, style=RICH_STYLES.get(kind or "", "dim"))
        out.append("|")
    return out


def figure_bytes(t: Timing, fmt: str) -> bytes:
    """The timeline as a ``"png"`` or ``"svg"`` file's bytes: ranks as rows, bars coloured by
    kind. Nothing is written: the caller decides where (and checks it can, first)."""
    # Imported here: `shardlab schedule`'s terminal view imports this module; only PNG/SVG draw.
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    s = t.schedule
    # A Figure of its own, never pyplot: no GUI backend and no global figure list.
    fig = Figure(figsize=(min(24.0, 5 + t.makespan / 4), 1.2 + 0.45 * s.pp))
    ax = fig.subplots()
    for r, ev in enumerate(t.events):
        for kind, colour in COLOURS.items():
            for chunk in range(s.virtual_stages):
                bars = [(e.start, e.end - e.start) for e in ev
                        if e.action.kind == kind and s.chunk_of_stage[e.action.stage] == chunk]
                if bars:  # later chunks lighter, so a rank's two halves of a V stand apart
                    ax.broken_barh(bars, (r - 0.4, 0.8), facecolors=colour,
                                   alpha=1.0 - 0.35 * chunk / max(1, s.virtual_stages - 1),
                                   edgecolor="white", linewidth=0.5)
        if s.num_actions <= 400:  # label micro-batches while they stay legible
            for e in ev:
                ax.text((e.start + e.end) / 2, r, str(e.action.microbatch), ha="center",
                        va="center", fontsize=7, color="white")
    ax.set_yticks(range(s.pp), [f"rank {r}" for r in range(s.pp)])
    ax.invert_yaxis()
    ax.set_xlim(0, t.makespan or 1.0)  # all durations 0: a unit range rather than [0, 0]
    ax.set_xlabel("time")
    ax.set_title(f"{s.name}: p={s.pp} m={s.microbatches} v={s.virtual_stages}, "
                 f"bubble {t.bubble:.1%}, makespan {t.makespan:g}")
    used = {e.action.kind for ev in t.events for e in ev}
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items() if k in used],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120)
    return buf.getvalue()
