"""Small helpers over rich: one console, tables with right-aligned numbers."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 here; let the command line treat a closed pipe as the end of output.
        raise BrokenPipeError


console = _Console(highlight=False)
if not console.is_terminal:
    # A pipe or file has no width; rich would assume 80 and wrap the wider tables.
    console = _Console(highlight=False, width=110)


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]],
          caption: str | None = None, left: int = 1) -> Table:
    """A table whose first ``left`` columns are left-aligned (text), the rest right (numbers)."""
    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i < left else "right")
    for r in rows:
        t.add_row(*(str(x) for x in r))
    return t


def show(*items: object) -> None:
    """Print tables and lines to the console, one after another."""
    for item in items:
        console.print(item)
