"""One self-contained HTML page: inline CSS, inline SVG charts, no script, no network.

A report is a list of :class:`Section` s, each a heading and HTML blocks built by the
helpers here. Every string that reaches the page goes through :func:`esc` (model names
come from users' config files); charts are SVG that matplotlib wrote, whose text it
escapes itself. A Content-Security-Policy meta tag forbids every fetch and every
script, so even a mistake cannot make the page reach the network. Files are written
whole to a temporary name in the same folder, then renamed: never half a report.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from shardlab import __version__
from shardlab.config.files import check_output as check_output
from shardlab.config.files import try_writing
from shardlab.config.files import umask_mode as umask_mode
from shardlab.config.files import write_atomic as write_atomic
from shardlab.errors import SpecError
from shardlab.report.charts import Chart

# No fetches (default-src 'none'), no scripts; inline styles and data: images only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #ffffff; --band: #f6f8fa;
        --ok: #1a7f37; --bad: #cf222e; --accent: #0969da; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--fg); background: var(--bg); }
header, main, footer { max-width: 1100px; margin: 0 auto; padding: 0 16px; }
header { padding-top: 20px; }
h1 { font-size: 1.6em; margin: 0.2em 0; overflow-wrap: anywhere; }
h2 { font-size: 1.25em; margin: 1.6em 0 0.4em; padding-top: 0.4em;
     border-top: 1px solid var(--line); }
h3 { font-size: 1.05em; margin: 1.2em 0 0.3em; }
p, li { overflow-wrap: anywhere; }
.sub { color: var(--muted); margin: 0; }
nav { display: flex; flex-wrap: wrap; gap: 6px 14px; margin: 12px 0; }
nav a { color: var(--accent); text-decoration: none; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; margin: 8px 0 14px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; min-width: 50%; }
caption { text-align: left; color: var(--muted); padding: 4px 0; caption-side: bottom; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--band); text-align: left; }
td.n, th.n { text-align: right; white-space: nowrap; }
figure { margin: 10px 0 18px; }
/* A chart keeps a readable size on a phone and scrolls sideways inside its own box. */
.chart { overflow-x: auto; -webkit-overflow-scrolling: touch; }
.chart svg { display: block; width: 100%; height: auto; min-width: 560px; }
figcaption { color: var(--muted); font-size: 0.92em; margin-top: 4px; }
code, pre { font: 0.92em/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: var(--band); padding: 8px 10px; overflow-x: auto; white-space: pre; }
.ok { color: var(--ok); font-weight: 600; }
.bad { color: var(--bad); font-weight: 600; }
.note { color: var(--muted); }
footer { color: var(--muted); font-size: 0.85em; padding: 24px 16px 32px; }
@media (max-width: 600px) {
  body { font-size: 14px; }
  th, td { padding: 3px 6px; }
  h1 { font-size: 1.3em; }
}
"""


def esc(x: object) -> str:
    """``x`` as text that HTML shows literally (``<``, ``>``, ``&`` and quotes escaped)."""
    return html.escape(str(x), quote=True)


@dataclass
class Section:
    """One part of a report: an anchor id, a heading and HTML blocks (already safe)."""

    id: str
    title: str
    blocks: list[str] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)

    def add(self, *blocks: str) -> Section:
        """Append HTML blocks (from :func:`table_html`, :func:`para`, ...)."""
        self.blocks.extend(blocks)
        return self

    def chart(self, c: Chart) -> Section:
        """Append a chart as a figure, and remember it for ``--figures``."""
        self.charts.append(c)
        self.blocks.append(figure_html(c))
        return self


def para(text: str, cls: str | None = None) -> str:
    """A paragraph of plain text (escaped)."""
    attr = f' class="{esc(cls)}"' if cls else ""
    return f"<p{attr}>{esc(text)}</p>"


def heading(text: str) -> str:
    """A sub-heading inside a section."""
    return f"<h3>{esc(text)}</h3>"


def pre(text: str) -> str:
    """Preformatted text (a command line, a log tail), escaped."""
    return f"<pre>{esc(text)}</pre>"


def verdict(ok: bool, yes: str = "pass", no: str = "FAIL") -> str:
    """A coloured pass/fail word."""
    return f'<span class="{"ok" if ok else "bad"}">{esc(yes if ok else no)}</span>'


class Raw(str):
    """A table cell that is already HTML (a :func:`verdict`), not text to escape."""

    __slots__ = ()


def table_html(columns: Sequence[str], rows: Sequence[Sequence[object]],
               caption: str | None = None, left: int = 1) -> str:
    """A table whose first ``left`` columns are text (left-aligned), the rest numbers; in a
    horizontally scrolling box so a wide table never widens the page on a phone."""
    def cell(tag: str, i: int, v: object) -> str:
        cls = "" if i < left else ' class="n"'
        return f"<{tag}{cls}>{v if isinstance(v, Raw) else esc(v)}</{tag}>"

    head = "".join(cell("th", i, c) for i, c in enumerate(columns))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>"
                   for r in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def figure_html(c: Chart) -> str:
    """A chart's inline SVG with its caption."""
    cap = f"<figcaption>{esc(c.caption)}</figcaption>" if c.caption else ""
    return (f'<figure id="fig-{esc(c.name)}" data-chart="{esc(c.name)}">'
            f'<div class="chart">{c.svg}</div>{cap}</figure>')


def page(title: str, subtitle: Sequence[str], sections: Sequence[Section]) -> str:
    """The whole HTML document: head (charset, viewport, CSP, CSS), title, a table of
    contents, the sections and a footer saying what made it."""
    nav = "".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections)
    subs = "".join(f'<p class="sub">{esc(s)}</p>' for s in subtitle)
    body = "".join(f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{"".join(s.blocks)}'
                   "</section>" for s in sections)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>{esc(title)}</h1>{subs}<nav>{nav}</nav></header>"
            f"<main>{body}</main>"
            f"<footer>shardlab {esc(__version__)}, {esc(when)}. One file: every chart is "
            "inline SVG, nothing is fetched.</footer></body></html>\n")


# -- writing ---------------------------------------------------------------------------------


def check_figures_dir(path: str | Path) -> Path:
    """``--figures DIR``: a folder that exists or whose parent does, and can be written."""
    try:
        return _check_figures_dir(path)
    except OSError as e:  # a name too long for the file system, a loop of links, ...
        raise SpecError("figures", str(path), f"is not a usable path ({e.strerror or e})"
                        ) from None


def _check_figures_dir(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise SpecError("figures", str(path), "must be a folder (a file is there)")
    probe = p if p.is_dir() else p.parent.resolve()
    if not probe.is_dir():
        raise SpecError("figures", str(path), f"its parent folder {probe} does not exist")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise SpecError("figures", str(path), "cannot be written (permission denied)")
    try_writing("figures", path, probe)
    return p


def write_report(path: Path, text: str, charts: Sequence[Chart] = (),
                 figures: Path | None = None) -> list[Path]:
    """Write the page to ``path`` and, with ``figures``, each chart as ``NAME.svg`` and
    ``NAME.png`` in that folder; return the figure files written. A write that fails (after
    :func:`check_output` passed) is a SpecError naming ``output`` or ``figures``."""
    written: list[Path] = []
    if figures is not None:
        try:
            figures.mkdir(exist_ok=True)
            for c in charts:
                for suffix, data in ((".svg", c.svg_document.encode()), (".png", c.png())):
                    target = figures / f"{c.name}{suffix}"
                    write_atomic(target, data)
                    written.append(target)
        except OSError as e:  # checked before, so only a disk that filled or changed since
            raise SpecError("figures", str(figures), f"cannot be written ({e.strerror})") from None
    try:
        write_atomic(path, text.encode("utf-8"))
    except OSError as e:
        raise SpecError("output", str(path), f"cannot be written ({e.strerror})") from None
    return written
