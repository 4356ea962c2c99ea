"""The pipeline schedules, ZeRO stages and context parallelism each framework runs
(plan/framework_runs.py over plan/overlap.py's ``Framework``): what the planner searches
with ``--framework``, and what it refuses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.conftest import one_line_error, plan_json

from shardlab.config.layout import SCHEDULES
from shardlab.errors import SpecError
from shardlab.plan.framework_runs import framework_cp, framework_keeps, runs_text
from shardlab.plan.overlap import FRAMEWORKS, framework
from shardlab.plan.published import RUNS


def test_each_framework_names_only_known_schedules() -> None:
    for fw in FRAMEWORKS.values():
        assert fw.schedules is not None and set(fw.schedules) <= set(SCHEDULES)
    assert framework("megatron").schedules == ("1f1b", "interleaved-1f1b")
    assert framework("fsdp").schedules == framework("torchtitan").schedules  # torch's
    assert "zb-h2" not in framework("torchtitan").schedules
    assert framework(None).schedules is None  # no framework named: every schedule


def test_the_search_keeps_the_framework_s_schedules_and_an_explicit_one_is_refused() -> None:
    megatron = framework("megatron")
    assert framework_keeps(megatron, "schedules", SCHEDULES, explicit=False) == (
        "1f1b", "interleaved-1f1b")
    assert framework_keeps(framework(None), "schedules", SCHEDULES, explicit=True) == SCHEDULES
    with pytest.raises(SpecError, match=r"zb-v.*megatron runs 1f1b, interleaved-1f1b"):
        framework_keeps(megatron, "schedules", ("1f1b", "zb-v"), explicit=True)
    assert framework_keeps(framework("deepspeed"), "schedules", SCHEDULES, explicit=False
                           ) == ("1f1b",)
    assert runs_text(framework("deepspeed"), "schedules") == "--framework deepspeed runs 1f1b"
    # ZeRO: PyTorch FSDP and torchtitan have no optimizer-only sharding (ZeRO-1).
    for name in ("fsdp", "torchtitan"):
        assert framework_keeps(framework(name), "zero", (0, 1, 2, 3), explicit=False) == (
            0, 2, 3)
    with pytest.raises(SpecError, match="zero=1: --framework torchtitan runs ZeRO 0, 2, 3"):
        framework_keeps(framework("torchtitan"), "zero", (1, 3), explicit=True)
    assert framework_keeps(megatron, "zero", (0, 1, 2, 3), explicit=True) == (0, 1, 2, 3)


def test_every_published_run_runs_what_its_framework_has() -> None:
    for r in RUNS:
        fw = framework(r.framework)
        if r.pp > 1 and fw.schedules is not None:
            schedule = r.schedule or ("interleaved-1f1b" if r.virtual > 1 else "1f1b")
            assert schedule in fw.schedules, r.name
        if fw.zero is not None and r.gpus > r.tp * r.pp:
            assert r.zero in fw.zero, r.name
        assert r.cp == 1 or fw.context_parallel, r.name


def test_deepspeed_searches_no_context_parallelism(capsys: pytest.CaptureFixture[str]) -> None:
    deepspeed = framework("deepspeed")
    assert framework_cp(deepspeed, None) == (1,) == framework_cp(deepspeed, (1,))
    assert framework_cp(framework("megatron"), None) is None  # the search's own choices
    with pytest.raises(SpecError, match="cp=2: --framework deepspeed runs no context"):
        framework_cp(deepspeed, (1, 2))
    argv = ("llama-3-8b", "--gpu", "h100", "--gpus", "64", "--global-batch", "64", "--seq",
            "131072", "--top", "20")
    assert all(b["cp"] == 1 for b in plan_json(capsys, *argv, "--framework",
                                               "deepspeed")["best"])
    # At 128K tokens the planner's own choice is context parallel (here, Megatron's).
    assert plan_json(capsys, *argv, "--framework", "megatron")["best"][0]["cp"] > 1


@pytest.mark.parametrize(("fw", "allowed"), [
    ("megatron", {"1f1b", "interleaved-1f1b"}),
    ("deepspeed", {"1f1b"}),
])
def test_a_framework_s_plan_ranks_only_what_it_runs(capsys: pytest.CaptureFixture[str],
                                                    fw: str, allowed: set[str]) -> None:
    doc = plan_json(capsys, "llama-3-70b", "--gpu", "h100", "--gpus", "64",
                    "--global-batch", "64", "--framework", fw, "--top", "50")
    piped = [b for b in doc["best"] if b["pp"] > 1]
    assert piped and {b["schedule"] for b in piped} <= allowed


@pytest.mark.parametrize("fw", ["fsdp", "torchtitan"])
def test_fsdp_stacks_plan_no_zero_1(capsys: pytest.CaptureFixture[str], fw: str) -> None:
    doc = plan_json(capsys, "llama-3-8b", "--gpu", "h100", "--gpus", "16",
                    "--global-batch", "32", "--framework", fw, "--top", "200")
    assert doc["best"] and all(b["zero"] in (0, 2, 3) for b in doc["best"])


@pytest.mark.parametrize(("argv", "words"), [
    (["--framework", "megatron", "--schedules", "1f1b,zb-v"],
     ["schedules='zb-v'", "megatron runs 1f1b, interleaved-1f1b"]),
    (["--framework", "megatron", "--layout", "dp=8 tp=1 pp=8 virtual=2 schedule=zb-v"],
     ["schedule='zb-v'", "megatron runs"]),
    (["--framework", "fsdp", "--schedules", "zb-h2"],
     ["schedules='zb-h2'", "fsdp runs gpipe, 1f1b"]),
    (["--framework", "torchtitan", "--zero", "1,3"],
     ["zero=1", "torchtitan runs ZeRO 0, 2, 3"]),
    (["--framework", "fsdp", "--layout", "dp=64 tp=1 pp=1 zero=1"],
     ["zero=1", "fsdp runs ZeRO 0, 2, 3"]),
    (["--framework", "deepspeed", "--seq", "8192", "--layout", "dp=32 cp=2 tp=1 pp=1 zero=1"],
     ["cp=2", "deepspeed runs no context parallelism", "Ulysses"]),
    (["--framework", "deepspeed", "--layout", "dp=4 tp=8 pp=2 zero=3"],
     ["zero=3", "deepspeed pipelines with ZeRO 0-1 only (pp=2)"]),
    (["--framework", "megatron", "--measured-step", "10", "--measured-layout",
      "dp=8 tp=1 pp=8 virtual=2 schedule=zb-v"], ["schedule='zb-v'", "megatron runs"]),
])
def test_what_the_framework_does_not_run_is_one_line(
        capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]) -> None:
    line = one_line_error(capsys, ["plan", "llama-3-70b", "--gpu", "h100", "--gpus", "64",
                                   "--global-batch", "64", *argv])
    for w in words:
        assert w in line, line


def test_deepspeed_pipelines_with_zero_0_or_1_only(capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, "llama-3-70b", "--gpu", "h100", "--gpus", "64", "--global-batch",
                    "64", "--framework", "deepspeed", "--top", "200")
    assert doc["framework_runs"] == {"schedules": ["1f1b"], "zero": None,
                                     "context_parallel": False, "pipeline_max_zero": 1}
    piped = [b for b in doc["best"] if b["pp"] > 1]
    assert piped and all(b["zero"] <= 1 for b in piped)
    assert any(b["zero"] >= 2 for b in doc["best"] if b["pp"] == 1)  # ZeRO-3 without pp
    assert doc["rejected"]["ZeRO above what the framework pipelines (DeepSpeed: 0-1)"] > 0


def test_the_fit_advice_skips_what_the_framework_does_not_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch",
                    "64", "--seq", "8192", "--framework", "torchtitan", "--layout",
                    "dp=8 tp=1 pp=1 micro_batch=8 zero=0 recompute=none")
    fit = doc["fit"]
    tried = {c["change"] for c in fit["changes"]}
    assert "zero=3" in tried and "zero=1" not in tried
    assert {"change": "zero=1", "reason": "--framework torchtitan runs ZeRO 0, 2, 3"} in fit[
        "skipped"]


def test_the_printed_plan_says_what_the_search_kept_to() -> None:
    argv = ["plan", "llama-3-8b", "--gpu", "h100", "--gpus", "16", "--global-batch", "32",
            "--top", "1"]
    out = _printed([*argv, "--framework", "deepspeed"])
    assert "deepspeed runs only: schedules 1f1b, ZeRO <= 1 with pp > 1, no cp" in out
    assert "runs only:" not in _printed(argv)  # no framework: every layout


def _printed(argv: list[str]) -> str:
    """``shardlab ARGV``'s printed plan, lines joined (rich wraps them at the terminal)."""
    r = subprocess.run([sys.executable, "-m", "shardlab", *argv], capture_output=True,
                       text=True, timeout=120, check=True, env={**os.environ, "COLUMNS": "400"})
    return " ".join(r.stdout.split())
