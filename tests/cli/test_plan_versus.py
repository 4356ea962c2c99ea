"""``shardlab plan --layout A --versus B`` (cli/plan_versus.py): B priced beside A, their
ratio, the kind of change and the published pairs' record for it. Ratios compare with
``pytest.approx(rel=1e-12)`` (one division)."""

from __future__ import annotations

import pytest
from tests.conftest import one_line_error, plan_json

from shardlab.plan.choice_kinds import CHOOSER
from shardlab.report.plan_view import versus_line

JOB = ["llama-3-70b", "--gpu", "h100", "--gpus", "64", "--global-batch", "128"]
TP = "dp=8 tp=8 sp=1 recompute=full"


def test_b_is_priced_as_its_own_layout_and_the_ratio_is_b_over_a(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, *JOB, "--layout", f"{TP} overlap_tp=0", "--versus",
                    f"{TP} overlap_tp=1")
    v = doc["versus"]
    alone = plan_json(capsys, *JOB, "--layout", f"{TP} overlap_tp=1")["best"][0]
    assert v["best"]["step_seconds"] == alone["step_seconds"]
    assert v["ratio"] == pytest.approx(alone["step_seconds"] / doc["best"][0]["step_seconds"],
                                       rel=1e-12)
    assert v["ratio"] < 1  # hiding tensor-parallel collectives is faster
    assert v["changes"] == {"overlap_tp": ["0", "1"]} and v["kind"] == "overlap"
    pairs, error, scored, agreed = CHOOSER["overlap"]
    assert v["chooser"] == {"pairs": pairs, "ratio_error": error, "scored": scored,
                            "agreed": agreed}


def test_a_layout_change_carries_the_layout_pairs_record(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, *JOB, "--framework", "megatron", "--layout", TP, "--versus",
                    "dp=2 tp=4 pp=8 virtual=5 sp=1 recompute=none")
    v = doc["versus"]
    assert v["kind"] == "layout" and {"tp", "pp", "recompute"} <= set(v["changes"])
    line = versus_line(v)
    pairs, error, scored, agreed = CHOOSER["layout"]
    assert (f"(a layout change); on {pairs} published pairs of that kind the planner's ratio "
            f"was off by {error:.1%} on average and ordered {agreed} of {scored}") in line
    assert plan_json(capsys, *JOB, "--layout", TP)["versus"] is None


@pytest.mark.parametrize(("argv", "words"), [
    (["--versus", TP], ["versus=", "give --layout"]),
    (["--layout", TP, "--versus", TP], ["is the layout --layout gives"]),
    (["--layout", TP, "--versus", "overlap_tp=1"], ["must name a layout"]),
    (["--framework", "megatron", "--layout", TP, "--versus",
      "dp=8 tp=1 pp=8 virtual=2 schedule=zb-v"], ["schedule='zb-v'", "megatron runs"]),
])
def test_bad_versus_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                words: list[str]) -> None:
    line = one_line_error(capsys, ["plan", *JOB, *argv])
    for w in words:
        assert w in line, line
