"""The charts of the HTML reports, drawn with matplotlib and kept as SVG text (and PNG on demand).

Figures are built on ``matplotlib.figure.Figure`` directly, never through pyplot, so
no GUI backend and no global figure list are involved. SVG text is written as
``<text>`` (``svg.fonttype = none``: small files, selectable words), which matplotlib
escapes; ids inside each SVG are salted with the chart's name so two charts inlined
in one page never share a clip-path id. No chart draws a string a user typed (model
names stay in the HTML, where they are escaped): matplotlib would read ``$...$`` as
mathematics.
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

# One colour per part, the same in every chart (Tableau 10, readable when printed grey).
PART_COLOURS = {
    "weights": "#4C78A8", "gradients": "#F58518", "optimizer": "#54A24B",
    "activations": "#E45756", "temporaries": "#B279A2",
    "compute": "#4C78A8", "recompute": "#72B7B2", "tp_comm": "#F58518", "dp_comm": "#9D755D",
    "pp_comm": "#B279A2", "ep_comm": "#EECA3B", "cp_comm": "#FF9DA6", "bubble": "#BAB0AC",
}
CAPACITY_COLOUR = "#cf222e"


def _rc() -> dict[str, Any]:
    # A fixed hash salt: the same chart gives the same SVG (ids are made unique per page by
    # Chart.svg).
    return {"svg.fonttype": "none", "svg.hashsalt": "shardlab", "font.size": 9,
            "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
            "grid.alpha": 0.3, "figure.dpi": 100}


@dataclass
class Chart:
    """One rendered chart: a name (file stem and anchor), a caption, the SVG text."""

    name: str
    caption: str
    svg_document: str  # the whole .svg file
    _png: Callable[[], bytes]

    @property
    def svg(self) -> str:
        """The ``<svg>`` element alone, to inline in HTML: no XML declaration or doctype, and
        every id (and reference to one) prefixed with the chart's name, since matplotlib
        numbers ids per figure (``axes_1``) and a page holds many figures."""
        body = self.svg_document[self.svg_document.index("<svg"):]

        def prefix(tag: re.Match[str]) -> str:
            t = re.sub(r'(\sid=")', rf"\1{self.name}-", tag.group(0))
            t = re.sub(r'(href="#)', rf"\1{self.name}-", t)
            return re.sub(r"(url\(#)", rf"\1{self.name}-", t)

        # Only inside tags: text between them is escaped and never holds "<".
        return re.sub(r"<[^<>]+>", prefix, body)

    def png(self) -> bytes:
        """The same chart as PNG (rendered when asked: only ``--figures`` needs it)."""
        return self._png()


def new_figure(width: float = 8.0, height: float = 3.6) -> Any:
    """A bare matplotlib Figure (no pyplot) of ``width`` x ``height`` inches."""
    return Figure(figsize=(width, height), layout="constrained")


def style() -> Any:
    """A context in which matplotlib draws and saves in the reports' style."""
    return matplotlib.rc_context(_rc())


F = TypeVar("F", bound=Callable[..., Chart])


def styled(fn: F) -> F:
    """Run a chart builder under the reports' matplotlib style (fonts, grid, SVG text), which
    matplotlib reads while artists are created as well as when they are saved."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Chart:
        with style():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def render(fig: Any, name: str, caption: str = "") -> Chart:
    """Turn a finished Figure into a :class:`Chart` (SVG now; PNG when asked)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise ValueError(f"chart name {name!r}: lower-case letters, digits and '-' only")
    buf = io.StringIO()
    with style():
        # No RDF metadata block: nothing dated, nothing but the drawing.
        fig.savefig(buf, format="svg", metadata=dict.fromkeys(("Date", "Creator", "Format",
                                                               "Type")))

    def png() -> bytes:
        out = io.BytesIO()
        with style():
            fig.savefig(out, format="png", dpi=150)
        return out.getvalue()

    return Chart(name, caption, buf.getvalue(), png)


def _axes(fig: Any) -> Any:
    return fig.add_subplot()


# -- bars --------------------------------------------------------------------------------------


@styled
def stacked_bars(name: str, caption: str, labels: Sequence[str],
                 parts: Mapping[str, Sequence[float]], *, horizontal: bool = False,
                 scale: float = 1.0, unit: str = "", limit: float | None = None,
                 limit_label: str = "", highlight: int | None = None,
                 title: str = "", more_limits: Sequence[tuple[float, str]] = ()) -> Chart:
    """Bars made of ``parts`` (name -> one value per label), divided by ``scale`` and shown
    in ``unit``; an optional ``limit`` line (a device's capacity) and one bar outlined;
    ``more_limits`` (value, label): further lines, dotted (the capacity less an allowance)."""
    n = len(labels)
    fig = new_figure(8.0, max(2.2, 0.9 + 0.32 * n) if horizontal else 3.8)
    ax = _axes(fig)
    base = [0.0] * n
    pos = list(range(n))
    for part, values in parts.items():
        v = [x / scale for x in values]
        colour = PART_COLOURS.get(part)
        label = part.replace("_", " ")
        if horizontal:
            ax.barh(pos, v, left=base, color=colour, label=label, height=0.7)
        else:
            ax.bar(pos, v, bottom=base, color=colour, label=label, width=0.7)
        base = [b + x for b, x in zip(base, v, strict=True)]
    if highlight is not None and 0 <= highlight < n:
        kw = {"fill": False, "edgecolor": "#1f2328", "linewidth": 1.6}
        if horizontal:
            ax.barh([highlight], [base[highlight]], height=0.7, **kw)
        else:
            ax.bar([highlight], [base[highlight]], width=0.7, **kw)
    line = ax.axvline if horizontal else ax.axhline
    if limit is not None:
        line(limit / scale, color=CAPACITY_COLOUR, linestyle="--", linewidth=1.3,
             label=limit_label or None)
    for value, label in more_limits:
        line(value / scale, color=CAPACITY_COLOUR, linestyle=":", linewidth=1.3,
             label=label or None)
    if horizontal:
        ax.set_yticks(pos, labels)
        ax.invert_yaxis()
        ax.set_xlabel(unit)
    else:
        ax.set_xticks(pos, labels, rotation=0 if n <= 6 else 35,
                      ha="center" if n <= 6 else "right")
        ax.set_ylabel(unit)
    if title:
        ax.set_title(title, loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return render(fig, name, caption)


@styled
def bars(name: str, caption: str, labels: Sequence[str], values: Sequence[float], *,
         unit: str = "", colour: str = "#4C78A8", log: bool = False,
         notes: Sequence[str] | None = None) -> Chart:
    """Horizontal bars, one per label, each with its value (or its ``notes`` entry) written
    beside it."""
    fig = new_figure(8.0, max(1.8, 0.8 + 0.32 * len(labels)))
    ax = _axes(fig)
    pos = list(range(len(labels)))
    ax.barh(pos, values, color=colour, height=0.65)
    ax.set_yticks(pos, labels)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(unit)
    for p, v, note in zip(pos, values, notes or [f"{v:,.4g}" for v in values], strict=True):
        ax.annotate(note, (v, p), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.margins(x=0.15)
    return render(fig, name, caption)


# -- lines -------------------------------------------------------------------------------------


@styled
def lines(name: str, caption: str, series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
          *, xlabel: str, ylabel: str, styles: Mapping[str, str] | None = None,
          right: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
          right_label: str = "", logx: bool = False, logy: bool = False,
          limit: float | None = None, limit_label: str = "",
          right_scale: tuple[str, float] | None = None, integer_x: bool = False) -> Chart:
    """Line plots of named (x, y) series; ``right`` series on a second y axis, or
    ``right_scale`` (label, factor): a right axis that reads the left one times ``factor``
    (a quantity proportional to the plotted one); an optional horizontal ``limit`` line (a
    capacity) on the left axis."""
    fig = new_figure(8.0, 3.4)
    ax = _axes(fig)
    styles = styles or {}
    handles = []
    for label, (x, y) in series.items():
        handles += ax.plot(x, y, styles.get(label, "-"), label=label, linewidth=1.4,
                           markersize=3)
    if limit is not None:
        handles.append(ax.axhline(limit, color=CAPACITY_COLOUR, linestyle="--", linewidth=1.3,
                                  label=limit_label or "limit"))
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if right_scale is not None:
        label, factor = right_scale
        sec = ax.secondary_yaxis("right", functions=(lambda y: y * factor,
                                                     lambda y: y / factor))
        sec.set_ylabel(label)
    if right:
        ax2 = ax.twinx()
        ax2.grid(False)
        colours = ("#54A24B", "#F58518", "#B279A2")
        for (label, (x, y)), c in zip(right.items(), colours, strict=False):
            handles += ax2.plot(x, y, styles.get(label, "--"), color=c, label=label,
                                linewidth=1.2, markersize=3)
        ax2.set_ylabel(right_label)
        ax2.spines["right"].set_visible(True)
    ax.legend(handles=handles, loc="best", fontsize=8, frameon=False)
    return render(fig, name, caption)


# -- the roofline ------------------------------------------------------------------------------


@styled
def roofline(name: str, caption: str, peak: float, bandwidth: float,
             points: Mapping[str, Sequence[tuple[str, float, float]]]) -> Chart:
    """Williams et al.'s roofline: attainable FLOP/s = min(peak, bandwidth x intensity), log-log,
    with each operator (label, intensity FLOP/B, attainable FLOP/s) as a numbered point per
    group; the numbers are listed in a table beside the chart."""
    fig = new_figure(8.0, 4.2)
    ax = _axes(fig)
    xs = [i for group in points.values() for _, i, _ in group if i > 0 and math.isfinite(i)]
    ridge = peak / bandwidth
    lo = min([ridge / 100, *xs]) / 2
    hi = max([ridge * 100, *xs]) * 2
    grid = [lo * (hi / lo) ** (k / 200) for k in range(201)]
    ax.plot(grid, [min(peak, bandwidth * x) / 1e12 for x in grid], color="#1f2328",
            linewidth=1.6, label="roof: min(peak, bandwidth × intensity)")
    ax.axvline(ridge, color="#59636e", linestyle=":", linewidth=1,
               label=f"ridge point {ridge:.0f} FLOP/B")
    markers = ("o", "s", "^", "D")
    colours = ("#4C78A8", "#F58518", "#54A24B", "#E45756")
    for (group, pts), mk, c in zip(points.items(), markers, colours, strict=False):
        ok = [(k, i, f) for k, (_, i, f) in enumerate(pts, 1) if i > 0 and math.isfinite(i)]
        ax.scatter([i for _, i, _ in ok], [f / 1e12 for _, _, f in ok], marker=mk, color=c,
                   label=group, zorder=3, s=26)
        for ks, i, f in _clusters(ok):
            ax.annotate(",".join(map(str, ks)), (i, f / 1e12), xytext=(4, 4),
                        textcoords="offset points", fontsize=7, color=c)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(top=peak / 1e12 * 3)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    return render(fig, name, caption)


def _clusters(pts: Sequence[tuple[int, float, float]], close: float = 0.08
              ) -> list[tuple[list[int], float, float]]:
    """Points (number, x, y) merged when they lie within ``close`` decades of each other on
    both log axes, so operators that share a spot get one label ("1,6,9"), not a smudge."""
    out: list[tuple[list[int], float, float]] = []
    for k, x, y in sorted(pts, key=lambda p: (p[1], p[2])):
        for ks, cx, cy in out:
            if abs(math.log10(x / cx)) < close and abs(math.log10(y / cy)) < close:
                ks.append(k)
                break
        else:
            out.append(([k], x, y))
    for ks, _, _ in out:
        ks.sort()
    return out
