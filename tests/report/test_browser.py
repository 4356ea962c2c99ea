"""The reports in a real headless Chromium: they load with no console error and no request
but the file itself, every chart is drawn at a real size, a phone gets no sideways scroll,
and a screenshot is not blank. Skipped, with the reason, where Chromium cannot run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardlab.cli import main

pytestmark = pytest.mark.browser

PHONE, LAPTOP = (390, 844), (1366, 900)


def check(seen: Any, html: str) -> None:
    """Everything a loaded report must show (``seen``: the conftest's ``Seen``)."""
    assert seen.console_errors == []
    assert seen.outside == [], "the page asked the network for something"
    assert len(seen.charts) == html.count("data-chart=") > 0
    for c in seen.charts:
        assert c["width"] > 300 and c["height"] > 100 and c["drawn"] > 20, c
    assert seen.scroll_width <= seen.inner_width, "the page scrolls sideways"
    spread, colours = seen.pixels
    assert spread > 10 and colours > 50, (spread, colours)


@pytest.mark.multiprocess
@pytest.mark.parametrize("size", [PHONE, LAPTOP], ids=["phone", "laptop"])
def test_demo_report(demo: Any, load_page: Callable, size: tuple[int, int]) -> None:
    # Budget, plan and run sections in one page: every kind of chart the reports draw.
    assert demo.returncode == 0, demo.stderr[-3000:]
    check(load_page(demo.report, *size), demo.report.read_text())


@pytest.mark.multiprocess
def test_run_report(run_dir: Path, load_page: Callable, tmp_path: Path) -> None:
    out = tmp_path / "run.html"
    assert main(["report", "run", str(run_dir), "-o", str(out)]) == 0
    check(load_page(out, *PHONE), out.read_text())


def test_the_harness_sees_a_fetch_and_an_error(load_page: Callable, tmp_path: Path) -> None:
    # The checks above can fail: a page that fetches and breaks is caught.
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="https://example.invalid/x.png">'
                   '<div style="width:2000px">wide</div></body></html>')
    seen = load_page(bad, *PHONE)
    assert seen.outside == ["https://example.invalid/x.png"]
    assert seen.console_errors and seen.scroll_width > seen.inner_width and not seen.charts
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    assert load_page(blank, *PHONE).pixels[1] == 1


def test_dryrun_report(load_page: Callable, tmp_path: Path) -> None:
    # From a saved `shardlab dryrun --json` (no dry run here): the kind that is not in the demo.
    out = tmp_path / "dryrun.html"
    sample = Path(__file__).parent / "data" / "dryrun-tp2-pp2.json"
    assert main(["report", "dryrun", "--from", str(sample), "-o", str(out)]) == 0
    check(load_page(out, *PHONE), out.read_text())
