"""Drawings: ASCII rows, PNG and SVG files (the Chrome trace is test_stream's)."""

import warnings

from shardlab.schedules.draw import ascii_timeline, figure_bytes
from shardlab.schedules.generators import build
from shardlab.schedules.simulate import Durations, simulate


def test_ascii_rows_show_every_rank_and_the_idle_time() -> None:
    t = simulate(build("1f1b", 3, 4))
    text = ascii_timeline(t, width=60)
    lines = text.splitlines()
    assert len(lines) == 3 and all(len(line) == len(lines[0]) for line in lines)
    assert "F0" in lines[0] and "·" in lines[0] and "B" in lines[2]


def test_png_and_svg_bytes() -> None:
    t = simulate(build("zb-v", 2, 4))
    png, svg = figure_bytes(t, "png"), figure_bytes(t, "svg")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert b"<svg" in svg[:500]


def test_a_timeline_of_zero_durations_draws_without_a_warning() -> None:
    # All durations 0 make the makespan 0: the x range must not be [0, 0], about which
    # matplotlib warns on stderr.
    t = simulate(build("1f1b", 2, 2), Durations(0.0, 0.0, 0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert b"<svg" in figure_bytes(t, "svg")[:500]
