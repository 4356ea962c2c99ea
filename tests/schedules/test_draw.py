"""Drawings: ASCII rows, PNG and SVG files, and the Chrome trace."""

import json
from pathlib import Path

from shardlab.schedules.draw import ascii_timeline, chrome_trace, save_figure, save_trace
from shardlab.schedules.generators import build
from shardlab.schedules.simulate import simulate


def test_ascii_rows_show_every_rank_and_the_idle_time() -> None:
    t = simulate(build("1f1b", 3, 4))
    text = ascii_timeline(t, width=60)
    lines = text.splitlines()
    assert len(lines) == 3 and all(len(line) == len(lines[0]) for line in lines)
    assert "F0" in lines[0] and "·" in lines[0] and "B" in lines[2]


def test_png_svg_and_trace_files(tmp_path: Path) -> None:
    t = simulate(build("zb-v", 2, 4))
    png, svg, trace = tmp_path / "t.png", tmp_path / "t.svg", tmp_path / "t.json"
    save_figure(t, png)
    save_figure(t, svg)
    save_trace(t, trace)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "<svg" in svg.read_text()[:500]
    doc = json.loads(trace.read_text())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == t.schedule.num_actions
    assert {e["tid"] for e in slices} == {0, 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.png", "t.svg"]  # no temps


def test_trace_times_in_microseconds() -> None:
    t = simulate(build("gpipe", 2, 2))
    first = next(e for e in chrome_trace(t, time_unit_s=1e-3)["traceEvents"] if e["ph"] == "X")
    assert first["ts"] == 0 and first["dur"] == 1000.0
