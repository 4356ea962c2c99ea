"""``shardlab demo`` end to end (run once by the conftest): the 100B budget, a plan on this
machine, a real 2-process run matching one process, predicted vs measured, one report."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.multiprocess
def test_the_whole_demo(demo: Any) -> None:
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    out = demo.stdout
    for n in range(1, 6):
        assert f"{n}/5" in out
    assert "hypo-100b" in out and "measuring its matmul peak" in out
    assert "run it: shardlab train" in out  # the plan's winner, then trained as planned
    assert "(tolerance 1e-05): pass" in out  # parity with one process
    assert "Predicted vs measured" in out and "step time" in out
    assert f"report: {demo.report}" in out
    html = demo.report.read_text()
    for anchor in ("budget-memory", "plan-ranked", "plan-winner", "run-loss", "run-pvm"):
        assert f'id="{anchor}"' in html
    assert html.count("data-chart=") >= 9 and "<script" not in html
    assert (demo.cwd / "home" / "cpu.json").is_file()
    assert sorted(p.name for p in demo.cwd.iterdir()) == ["demo-report.html", "home", "run"]
    # How long it takes depends on this CPU: the README gives measured times, and the
    # measurement's phases are budgeted (tests/calibrate/test_budget.py).
