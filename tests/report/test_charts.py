"""Charts: SVG that inlines safely (escaped text, ids apart), PNG on demand, labels merged."""

from __future__ import annotations

import re

from shardlab.report import charts


def test_svg_inlines_and_png_decodes() -> None:
    c = charts.bars("c1", "cap", ["a", "b"], [1.0, 3.0])
    assert c.svg.startswith("<svg") and c.svg_document.startswith("<?xml")
    assert "<?xml" not in c.svg and "<!DOCTYPE" not in c.svg
    assert c.png().startswith(b"\x89PNG\r\n\x1a\n")
    assert "<text" in c.svg  # words stay words (svg.fonttype none), not glyph paths


def test_text_is_escaped_by_matplotlib() -> None:
    c = charts.bars("c2", "", ["<b>&x"], [1.0])
    assert "&lt;b&gt;&amp;x" in c.svg and "<b>" not in c.svg


def test_two_charts_share_no_ids() -> None:
    a = charts.lines("one", "", {"s": ([0, 1], [1, 2])}, xlabel="x", ylabel="y")
    b = charts.lines("two", "", {"s": ([0, 1], [1, 2])}, xlabel="x", ylabel="y")
    ids = [set(re.findall(r'id="([^"]+)"', c.svg)) for c in (a, b)]
    assert ids[0] and ids[1] and not ids[0] & ids[1]


def test_stacked_bars_draw_each_part_and_the_limit() -> None:
    c = charts.stacked_bars("m", "", ["x", "y"], {"weights": [1e9, 2e9], "optimizer": [1e9, 0]},
                            scale=1e9, limit=80e9, limit_label="capacity", highlight=0)
    assert "<text" in c.svg
    for word in ("weights", "optimizer", "capacity"):
        assert word in c.svg


def test_roofline_clusters_points_that_share_a_spot() -> None:
    pts = [(1, 10.0, 1e12), (2, 10.5, 1.05e12), (3, 1000.0, 5e14), (4, 10.0, 1e12)]
    assert charts._clusters(pts) == [([1, 2, 4], 10.0, 1e12), ([3], 1000.0, 5e14)]
    c = charts.roofline("r", "", 1e15, 3e12, {"train": [("a", 10.0, 3e13), ("b", 1e3, 1e15)]})
    assert "ridge point 333 FLOP/B" in c.svg
