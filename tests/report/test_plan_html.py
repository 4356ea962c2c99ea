"""The plan page: the ranked layouts, the rejections, and the winner's timeline in seconds."""

from __future__ import annotations

from typing import Any

import pytest

from shardlab.cli.args import Parser
from shardlab.cli.plan import add_plan_args, plan_document
from shardlab.report.plan_html import layout_label, plan_sections, timeline_timing


def plan(*argv: str) -> dict[str, Any]:
    p = Parser()
    add_plan_args(p)
    return plan_document(p.parse_args(list(argv)))


@pytest.fixture(scope="module")
def gpt3() -> dict[str, Any]:
    return plan("gpt3-175b", "--gpus", "1024", "--global-batch", "1536")


def test_sections_of_a_pipelined_plan(gpt3: dict[str, Any]) -> None:
    sections = plan_sections(gpt3, prefix="p")
    assert [s.id for s in sections] == ["p-overview", "p-ranked", "p-rejected", "p-winner"]
    assert [c.name for s in sections for c in s.charts] == ["p-steps", "p-rejected",
                                                            "p-timeline"]
    best = gpt3["best"][0]
    steps = sections[1].charts[0].svg
    assert f"#1 {layout_label(best)}" in steps
    for reason in gpt3["rejected"]:
        assert reason in "".join(sections[2].blocks)


def test_timeline_in_seconds_of_the_planners_compute() -> None:
    # 1F1B on p ranks and m micro-batches lasts (m + p - 1) x (t_f + 2 t_f); with
    # t_f = compute / 3m that is compute x (m + p - 1) / m.
    b = {"schedule": "1f1b", "pp": 4, "microbatches": 8, "virtual_stages": 1,
         "breakdown": {"compute": 0.9, "recompute": 0.3}}
    t = timeline_timing(b)
    assert t.makespan == pytest.approx(1.2 * (8 + 4 - 1) / 8)
    assert t.bubble == pytest.approx(3 / 11)


def test_no_pipeline_no_timeline() -> None:
    doc = plan("gpt2", "--gpus", "8", "--global-batch", "64", "--max-pp", "1")
    sections = plan_sections(doc)
    assert all(b["pp"] == 1 for b in doc["best"])
    assert "plan-timeline" not in [c.name for s in sections for c in s.charts]
    assert "no timeline to draw" in "".join(sections[-1].blocks)


def test_an_anchored_plan_says_so_on_its_page() -> None:
    doc = plan("llama-3-8b", "--gpus", "8", "--global-batch", "64", "--seq", "4096",
               "--layout", "dp=8 zero=3 micro_batch=1", "--measured-step", "3.5")
    overview = "".join(plan_sections(doc)[0].blocks)
    assert "Anchored on your measured run: peak_fraction 0.650 -&gt; " in overview
    assert "takes 3.5 s as measured" in overview
    assert doc["best"][0]["step_seconds"] == pytest.approx(3.5, rel=1e-4)


def test_the_page_states_the_held_out_error_of_runs_like_the_winner(
        gpt3: dict[str, Any]) -> None:
    overview = "".join(plan_sections(gpt3)[0].blocks)
    assert "Held-out step-time error of published runs like this" in overview
    h100 = next(s for s in gpt3["accuracy"]["slices"] if s["slice"] == "H100/H200")
    assert f"H100/H200 {h100['mean_abs_error']:.1%} over {h100['runs']} runs" in overview
