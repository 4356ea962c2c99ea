"""``shardlab simulate`` from the command line: JSON fields, exit codes, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import shardlab.sim.run as sim_run
from shardlab.cli import guard, main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "--dp", "2", "--tp", "2", "--pp", "2", "--zero", "1",
                       "--steps", "2", "--dtype", "float64", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["devices"] == 8
    assert doc["max_param_diff"] <= 1e-12 and doc["max_loss_diff"] <= 1e-12
    for kind in ("dp", "tp", "pp"):
        c = doc["comm"][kind]
        assert len(c["counted_bytes"]) == 8 and c["counted_bytes"] == c["predicted_bytes"]
        assert all(x > 0 for x in c["counted_bytes"])
    s = doc["state_bytes"][0]
    assert s["counted"] == {k: int(v) for k, v in s["predicted"].items()}


@pytest.mark.parametrize("layout", [["--dp", "3"], ["--dp", "5", "--zero", "2"],
                                    ["--dp", "6", "--zero", "3"]], ids=" ".join)
def test_odd_dp_passes_with_counted_bytes_equal_to_predicted_per_rank(
        capsys: pytest.CaptureFixture[str], layout: list[str]) -> None:
    # Issue 22's figures, on a 1-layer model of 7,216 parameters (not a multiple of 3, 5 or
    # 6): each rank's bytes differ, and the cost model gives each its own.
    code, out, _ = run(capsys, "simulate", *layout, "--layers", "1", "--d-model", "16",
                       "--heads", "2", "--d-ff", "24", "--seq", "16", "--steps", "1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"]
    dp = doc["comm"]["dp"]
    assert dp["counted_bytes"] == dp["predicted_bytes"] and len(set(dp["counted_bytes"])) > 1
    assert {c["name"]: c["tolerance"] for c in doc["checks"]}["comm.dp"] == 0
    assert all(s["counted"] == s["predicted"] for s in doc["state_bytes"])


MOE = ["--experts", "8", "--top-k", "2", "--shared-experts", "1", "--dense-layers", "1",
       "--layers", "2", "--d-model", "32", "--expert-d-ff", "16", "--seq", "16"]


def test_moe_with_expert_parallelism_equals_one_device(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", *MOE, "--ep", "2", "--dp", "4", "--zero", "1",
                       "--capacity-factor", "1.25", "--steps", "1", "--dtype", "float64",
                       "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and "ep=2 etp=1 capacity_factor=1.25" in doc["layout"]
    assert doc["max_param_diff"] <= 1e-12 and doc["routing_imbalance"] >= 1
    ep = doc["comm"]["ep"]
    assert ep["counted_bytes"] == ep["predicted_bytes"] and all(ep["counted_bytes"])
    assert {c["name"]: c["tolerance"] for c in doc["checks"]}["comm.ep"] == 0


@pytest.mark.parametrize("layout", [["--dp", "2"], ["--dp", "2", "--zero", "3"],
                                    ["--dp", "4", "--zero", "1", "--dp-replicate", "2"]],
                         ids=" ".join)
def test_moe_without_expert_parallelism_reduces_the_experts_over_dp(
        capsys: pytest.CaptureFixture[str], layout: list[str]) -> None:
    """ep = 1: every replica holds every expert, whose gradients are summed over dp as the
    dense ones are (until 2026-12-07 they were reduced nowhere: params 2e-3 off and dp bytes
    214,272 against 1,787,136 over --dp 2; a KeyError under ZeRO-3 or HSDP)."""
    code, out, _ = run(capsys, "simulate", *MOE, *layout, "--steps", "1", "--dtype",
                       "float64", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["max_param_diff"] <= 1e-12
    dp = doc["comm"]["dp"]
    assert dp["counted_bytes"] == dp["predicted_bytes"] and all(dp["counted_bytes"])


def test_contiguous_routing_equals_one_device_with_every_expert_equally_loaded(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--routing contiguous`` (train's forced balance): the simulated ep layout equals one
    device, every expert takes T·k/E assignments (imbalance 1) and the all-to-all bytes
    are the cost model's."""
    code, out, _ = run(capsys, "simulate", *MOE, "--ep", "2", "--dp", "2", "--routing",
                       "contiguous", "--steps", "1", "--dtype", "float64", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["max_param_diff"] <= 1e-12
    assert doc["routing_imbalance"] == 1.0
    ep = doc["comm"]["ep"]
    assert ep["counted_bytes"] == ep["predicted_bytes"] and all(ep["counted_bytes"])


@pytest.mark.parametrize("layout", [
    ["--tp", "2", "--dp", "2"],
    ["--tp", "2", "--sp", "--pp", "2", "--zero", "3", "--dp", "2"],
    ["--tp", "2", "--ep", "2", "--dp", "2", "--experts", "4"],
], ids=" ".join)
def test_query_key_norms_equal_one_device(capsys: pytest.CaptureFixture[str],
                                          layout: list[str]) -> None:
    """``--qk-norm`` (Qwen3): the norms' weights serve heads the tensor ranks split, so their
    gradients are summed over tp (with or without sp); the simulated layout equals one
    device and every tensor-parallel byte is the cost model's. The MoE case (no shared
    experts, no sp) also checks that its MoE layers send no tensor-parallel bytes."""
    code, out, _ = run(capsys, "simulate", "--qk-norm", *layout, "--layers", "2",
                       "--d-model", "32", "--heads", "4", "--kv-heads", "2", "--seq", "16",
                       "--steps", "1", "--dtype", "float64", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and "qk_norm" in doc["model"]
    assert doc["max_param_diff"] <= 1e-12
    tp = doc["comm"]["tp"]
    assert tp["counted_bytes"] == tp["predicted_bytes"] and all(tp["counted_bytes"])


def test_context_parallel_uneven_stages_and_hsdp_flags(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "--cp", "2", "--pp", "2", "--stage-layers", "2+1",
                       "--dp", "2", "--zero", "2", "--dp-replicate", "2", "--layers", "3",
                       "--d-model", "16", "--heads", "2", "--seq", "16", "--steps", "1",
                       "--dtype", "float64", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["devices"] == 8
    assert "cp=2 stage_layers=2+1 dp_replicate=2" in doc["layout"]
    cp = doc["comm"]["cp"]
    assert cp["counted_bytes"] == cp["predicted_bytes"] and all(cp["counted_bytes"])
    assert {c["name"]: c["tolerance"] for c in doc["checks"]}["comm.cp"] == 0


def test_human_view_and_gpt_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "--style", "gpt", "--dp", "2", "--pp", "2",
                       "--schedule", "gpipe", "--steps", "1")
    assert code == 0
    for words in ("Checks", "counted vs cost model", "all checks pass", "embedding"):
        assert words in out


def test_exit_1_when_a_check_fails(capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_run, "TOLERANCE", {k: -1.0 for k in sim_run.TOLERANCE})
    code, out, _ = run(capsys, "simulate", "--dp", "2", "--steps", "1", "--json")
    assert code == 1 and json.loads(out)["passed"] is False


@pytest.mark.parametrize(("argv", "words"), [
    (["--tp", "3"], "tp=3"),
    (["--pp", "5"], "pp=5"),
    (["--dp", "2", "--microbatches", "2", "--global-batch", "6"], "global_batch=6"),
    (["--zero", "4"], "zero=4"),
    (["--sp"], "sp=1"),
    (["--vocab", "10"], "vocab=10"),
    (["--kv-heads", "3"], "kv_heads=3"),
    (["--qk-norm", "--style", "gpt"], "qk_norm=True: needs style llama"),
    (["--dtype", "float16"], "--dtype"),
    (["--schedule", "zb-v"], "--schedule"),
    (["nonexistent-model-x"], "model="),
    ([*MOE, "--ep", "3", "--dp", "3"], "ep=3"),
    ([*MOE, "--ep", "4", "--dp", "2"], "ep=4"),
    ([*MOE, "--tp", "2", "--etp", "2"], "etp=2"),
    ([*MOE, "--tp", "2", "--sp"], "sp=1"),
    (["--ep", "2"], "ep=2"),
    (["--capacity-factor", "1"], "capacity_factor=1.0"),
    ([*MOE, "--aux-loss-coef", "nan"], "--aux-loss-coef"),
    (["--routing", "contiguous"], "routing='contiguous': needs a mixture-of-experts"),
    (["--cp", "3"], "cp=3: must split seq (32) into 2*cp=6 equal chunks"),
    (["--pp", "2", "--stage-layers", "3,2"], "stage_layers='3+2': must sum to the model's 4"),
    (["--pp", "2", "--stage-layers", "4,0"], "stage_layers='4+0': must give every stage at"),
    (["--pp", "2", "--stage-layers", "4,x"], "stage_layers='4,x'"),
    (["--dp", "2", "--zero", "1", "--dp-replicate", "3"], "dp_replicate=3: must divide dp (2)"),
    ([*MOE, "--cp", "2"], "cp=2: the simulator runs context parallel on dense models only"),
])
def test_bad_input_is_one_line_before_work(capsys: pytest.CaptureFixture[str], argv: list[str],
                                           words: str) -> None:
    code, out, err = run(capsys, "simulate", *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_no_traceback_in_a_real_process() -> None:
    r = subprocess.run([sys.executable, "-m", "shardlab", "simulate", "--tp", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""


def test_absurd_device_counts_are_refused_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.monotonic()
    code, out, err = run(capsys, "simulate", "--dp", "100000", "--allow-oversubscribe")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "devices=100000" in err and "<= 256" in err, err
    assert time.monotonic() - start < 2  # refused from the figures (torch loaded above)


def test_a_model_too_big_for_this_host_is_refused_with_the_figures(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # gpt2 on 2 virtual devices and the reference: about 6.6 GB by the cost model.
    monkeypatch.setattr(guard, "available_memory_bytes", lambda: (4e9, "test"))
    start = time.monotonic()
    code, out, err = run(capsys, "simulate", "gpt2", "--steps", "1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "memory=" in err and "4.00 GB" in err and "--allow-oversubscribe" in err, err
    assert time.monotonic() - start < 2


def test_allow_oversubscribe_starts_anyway_and_shows_progress(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "available_memory_bytes", lambda: (1e6, "test"))
    code, out, err = run(capsys, "simulate", "--steps", "1", "--json")
    assert code == 2 and "memory=" in err and out == ""
    code, out, err = run(capsys, "simulate", "--steps", "1", "--json", "--allow-oversubscribe")
    assert code == 0 and json.loads(out)["passed"]  # stdout: the one document
    lines = err.strip().splitlines()  # stderr: what finished, as it finished
    assert len(lines) == 3 and "parameters" in lines[0] and "2 virtual devices" in lines[1]
    assert lines[2].strip().startswith("step 1/1: loss")


def test_shape_flags_beside_a_model_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A shape flag with MODEL used to be ignored without a word (issue 21, finding 17)."""
    code, out, err = run(capsys, "simulate", "gpt2", "--layers", "4", "--steps", "1")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--layers cannot be combined with MODEL (gpt2)" in err
