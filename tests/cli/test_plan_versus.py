"""``shardlab plan --layout A --versus B`` (cli/plan_versus.py): B priced beside A, their
ratio, the kind of change and the published pairs' record for it. Ratios compare with
``pytest.approx(rel=1e-12)`` (one division)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import one_line_error, plan_json

from shardlab.cli import main
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
    assert v["changes"] == {"overlap_tp": ["off", "on"]} and v["kind"] == "overlap"
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
    (["--layout", TP, "--versus", TP], ["is priced as --layout's layout is"]),
    (["--layout", TP, "--versus", "overlap_tp=1"], ["must name a layout"]),
    (["--framework", "megatron", "--layout", TP, "--versus",
      "dp=8 tp=1 pp=8 virtual=2 schedule=zb-v"], ["schedule='zb-v'", "megatron runs"]),
])
def test_bad_versus_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                words: list[str]) -> None:
    line = one_line_error(capsys, ["plan", *JOB, *argv])
    for w in words:
        assert w in line, line


FITS = "dp=2 tp=8 pp=4 virtual=5 sp=1 recompute=full zero=1"


def test_b_is_priced_with_the_base_policy_not_a_s_optimizer_dtype(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, *JOB, "--layout", f"{TP} optimizer_dtype=bf16", "--versus", TP)
    alone = plan_json(capsys, *JOB, "--layout", TP)["best"][0]
    b = doc["versus"]["best"]
    assert (b["step_seconds"], b["memory_per_device"]) == (alone["step_seconds"],
                                                           alone["memory_per_device"])
    assert doc["versus"]["changes"] == {"optimizer_dtype": [4, 12]}
    assert doc["versus"]["kind"] == "other" and doc["versus"]["chooser"] is None
    assert "the ratio's error is unknown" in versus_line(doc["versus"])


def test_a_layout_that_fits_against_one_that_does_not(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    doc = plan_json(capsys, *JOB, "--framework", "megatron", "--layout", FITS, "--versus", TP)
    assert doc["best"][0]["fits"] and not doc["versus"]["best"]["fits"]
    assert doc["versus"]["ratio"] > 1 and "does not fit" in versus_line(doc["versus"])


@pytest.mark.parametrize(("argv", "words"), [
    # Written as the defaults are, or another spelling of A's own key: nothing changes.
    (["--layout", TP, "--versus", f"{TP} overlap_tp=0"], ["is priced as --layout's"]),
    (["--layout", f"{TP} overlap_dp=1", "--versus", f"{TP} overlap_dp=on"],
     ["is priced as --layout's"]),
    # At pp 1 a schedule is no change.
    (["--layout", TP, "--versus", f"{TP} schedule=gpipe"], ["is priced as --layout's"]),
    # B's keys meet the same checks as A's, and its errors name --versus.
    (["--no-overlap-dp", "--layout", TP, "--versus", f"{TP} overlap_dp=1"],
     ["versus=", "overlap_dp", "--no-overlap-dp"]),
    (["--attention", "eager", "--layout", TP, "--versus", f"{TP} flash_kernel=fa3"],
     ["versus=", "flash_kernel"]),
    (["--layout", TP, "--versus", "x=1"], ["versus='x=1'"]),
    (["--layout", TP, "--versus", "dp=4 tp=8"], ["versus='dp=4 tp=8'", "gpus=64"]),
    (["--layout", "overlap_dp=0", "--versus", TP], ["versus=", "give --layout"]),
])
def test_b_that_changes_nothing_or_breaks_a_rule_is_one_line(
        capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]) -> None:
    line = one_line_error(capsys, ["plan", *JOB, *argv])
    for w in words:
        assert w in line, line


def test_the_plan_report_page_shows_the_versus_line(tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    assert main(["report", "plan", *JOB, "--layout", f"{TP} overlap_tp=0", "--versus",
                 f"{TP} overlap_tp=1", "-o", str(out)]) == 0
    assert ("Versus &quot;dp=8 tp=8 sp=1 recompute=full overlap_tp=1&quot;:" in out.read_text())
