"""`shardlab plan --measured-step`: the curve anchored on one measured run, then the plan on
it; and its bad input, one line each."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import one_line_error, plan_json

from shardlab.cli import main

# Megatron-Bridge 25.11's Llama 3 70B on 64 DGX H100s in fp8 (docs/validation.md, "MB
# Llama3-70B"): 10.23 s per step of 128 x 8,192 tokens.
JOB = ["llama-3-70b", "--gpu", "h100", "--gpus", "64", "--global-batch", "128", "--seq",
       "8192", "--framework", "megatron", "--dtype", "fp8"]
MEASURED = ("dp=2 tp=4 pp=8 virtual=5 micro_batch=1 zero=1 sp=1 recompute=none "
            "schedule=interleaved-1f1b overlap_dp=1 overlap_tp=1 reduce_dtype=bf16 fp8_params=1")



def test_the_measured_layout_is_priced_at_its_measurement(
        capsys: pytest.CaptureFixture[str]) -> None:
    plain = plan_json(capsys, *JOB, "--layout", MEASURED)
    doc = plan_json(capsys, *JOB, "--layout", MEASURED, "--measured-step", "10.23")
    a = doc["anchor"]
    assert plain["anchor"] is None
    assert (a["field"], a["measured_step"], a["layout"]) == ("fp8_peak_fraction", 10.23,
                                                              MEASURED)
    assert a["catalog"] == plain["efficiency"]["fp8_peak_fraction"]
    assert a["predicted_before"] == pytest.approx(plain["best"][0]["step_seconds"], rel=1e-9)
    # The plan runs on the anchored curve: the layout now takes the measured 10.23 s.
    assert doc["efficiency"]["fp8_peak_fraction"] == a["fitted"]
    assert doc["efficiency"]["peak_fraction"] == plain["efficiency"]["peak_fraction"]
    assert doc["best"][0]["step_seconds"] == pytest.approx(10.23, rel=1e-4)
    # Slower than the catalog says (10.23 s measured against its faster figure) is a
    # higher share, and the other way round.
    assert (a["fitted"] > a["catalog"]) == (a["predicted_before"] > 10.23)


def test_a_search_takes_the_measured_stack_s_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, *JOB, "--measured-layout", MEASURED, "--measured-step", "10.23",
                    "--top", "3")
    assert doc["candidates_evaluated"] > 1000 and doc["layout_given"] is None
    assert doc["step_keys_from"] == "--measured-layout"
    opts = doc["step_options"]
    assert (opts["overlap_dp"], opts["overlap_tp"], opts["fp8_params"]) == ("on", "on", True)
    # Every layout is priced on the anchored curve, the measured one among them.
    assert doc["efficiency"]["fp8_peak_fraction"] == doc["anchor"]["fitted"]
    assert doc["best"][0]["step_seconds"] <= 10.23 * (1 + 1e-4)


def test_the_view_says_what_was_anchored(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *JOB, "--layout", MEASURED, "--measured-step", "12"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "anchored on your measured run: fp8_peak_fraction 0.698 -> " in out
    assert "takes 12 s as measured (the catalog's curve: " in out
    assert "step options (megatron; --layout keys override)" in out
    # The held-out figures are the catalog curve's, and the line says so.
    assert "these are the catalog curve's figures, and --measured-step anchored it" in out



@pytest.mark.parametrize(("extra", "says"), [
    (["--measured-step", "-3"], "--measured-step: '-3' must be a finite number > 0"),
    (["--measured-step", "nan"], "--measured-step: 'nan' must be a finite number > 0"),
    (["--measured-layout", MEASURED], "measured_layout='dp=2 tp=4"),
    (["--measured-step", "10"], "measured_step=10.0: needs the layout it was measured on"),
    (["--measured-step", "0.01", "--measured-layout", MEASURED],
     "measured_step=0.01: faster than the planner can price this layout even at the whole "
     "dense peak"),
    (["--measured-step", "1e4", "--measured-layout", MEASURED],
     "measured_step=10000.0: slower than the planner prices this layout at 5% of the dense "
     "peak"),
    (["--measured-step", "10", "--measured-layout", "tq=4"], "tq"),
    (["--measured-step", "10", "--layout", "overlap_dp=0"],
     "measured_layout='overlap_dp=0': must name the layout that was measured"),
])
def test_bad_measurements_are_one_line(capsys: pytest.CaptureFixture[str], extra: list[str],
                                       says: str) -> None:
    err = one_line_error(capsys, ["plan", *JOB, *extra])
    assert says in err


def test_a_measured_layout_that_does_not_fit_is_anchored_with_a_note(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, *JOB[:-4], "--measured-step", "40", "--measured-layout",
                    "dp=64 zero=0")
    assert doc["anchor"]["fits"] is False
    assert any(n.startswith('the measured layout "dp=64 zero=0" does not fit by the '
                            "planner's count") for n in doc["notes"])


def test_a_job_file_search_keeps_to_train_and_the_anchor_does_not(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # ZeRO-1 and a bf16 optimizer are not what shardlab train runs, but the measured run
    # is only priced: the anchor takes it, the search and the job file keep to train's.
    job = tmp_path / "job.toml"
    doc = plan_json(capsys, "llama-3-8b", "--gpus", "16", "--global-batch", "64", "--seq",
                    "4096", "--measured-step", "2.0", "--measured-layout",
                    "dp=16 zero=1 optimizer_dtype=bf16", "--emit-config", str(job))
    assert doc["anchor"]["layout"] == "dp=16 zero=1 optimizer_dtype=bf16"
    assert doc["step_options"]["overlap_dp"] == "on" and doc["best"][0]["zero"] in (0, 2, 3)
    assert job.is_file()


def test_this_machine_s_curve_is_not_anchored(capsys: pytest.CaptureFixture[str],
                                             cpu_home: Path) -> None:
    err = one_line_error(capsys, ["plan", "--style", "llama", "--layers", "2", "--d-model",
                                  "64", "--heads", "4", "--gpu", "cpu", "--gpus", "2",
                                  "--global-batch", "8", "--measured-step", "0.05",
                                  "--measured-layout", "dp=2"])
    assert "only a catalog accelerator's curve is anchored" in err
