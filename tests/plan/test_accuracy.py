"""The held-out slices a plan is shown with (plan/accuracy.py): which slices a run or a
planned layout falls in, and the figures each carries. That the stored figures are the
runs' own is tests/plan/test_published.py's test (it predicts every held-out run)."""

from __future__ import annotations

import pytest

from shardlab.config.dtypes import POLICIES, get_policy
from shardlab.plan.accuracy import (
    ACCELERATOR_SLICES,
    DTYPE_SLICES,
    FEW,
    HELD_OUT,
    SLICES,
    Traits,
    accuracy,
    plan_accuracy,
    uneven,
)
from shardlab.plan.published import RUNS, run_traits
from shardlab.report.plan_view import accuracy_line


def _run(name: str) -> Traits:
    return run_traits(next(r for r in RUNS if r.name == name))


def test_every_slice_has_its_figures() -> None:
    assert list(SLICES) == list(HELD_OUT)
    assert set(ACCELERATOR_SLICES) <= set(SLICES)
    for runs, mean_abs, mean, worst in HELD_OUT.values():
        assert runs > 0 and 0 <= abs(mean) <= mean_abs <= worst


def test_a_published_run_falls_in_the_slices_of_what_it_is() -> None:
    # NeMo 25.04's Llama 3.1 405B fp8 on 256 GB200: TP 4, PP 8, CP 2, uneven stages.
    names = {s["slice"] for s in accuracy(_run("DGXC Llama3.1-405B GB200 256 FP8"))}
    assert names == {"B200/GB200", "fp8", "dense", "Megatron-LM / NeMo", "pipeline parallel",
                     "context parallel", "uneven pipeline stages"}
    # torchtitan's 8B on one node of 500 W H100s in bf16, FSDP only.
    names = {s["slice"] for s in accuracy(_run("TT-1 8B FSDP8 eager"))}
    assert names == {"bf16 / fp16", "H100/H200", "dense", "torchtitan",
                     "one node (8 GPUs or fewer)"}
    # fms-fsdp's HSDP 7B: the HSDP slice, thin (three runs: with BloombergGPT).
    hsdp = {s["slice"]: s for s in accuracy(_run("IBM 7b 96 H100 HSDP"))}["HSDP"]
    assert hsdp["thin"] and hsdp["runs"] == HELD_OUT["HSDP"][0] < FEW
    # BLOOM on DeepSpeed: its stack's slice, thin, and predicted fast (signed below 0).
    ds = {s["slice"]: s for s in accuracy(_run("BL 176B 384 GPUs"))}["DeepSpeed (BLOOM, "
                                                                     "BloombergGPT)"]
    assert ds["thin"] and ds["runs"] == 2 and ds["mean_error"] < 0


def test_each_slice_carries_its_stored_figures() -> None:
    t = Traits("A100 SXM 40GB", "fp16", None, False, 3072, pp=64)
    got = {s["slice"]: s for s in accuracy(t)}
    assert set(got) == {"bf16 / fp16", "A100", "dense", "pipeline parallel",
                        "over 1,000 GPUs"}
    runs, mean_abs, mean, worst = HELD_OUT["A100"]
    assert got["A100"] == {"slice": "A100", "runs": runs, "mean_abs_error": mean_abs,
                           "mean_error": mean, "worst_abs_error": worst,
                           "thin": False, "warning": False}


@pytest.mark.parametrize(("gpu", "held"), [("H100 SXM", True), ("H200 SXM", True),
                                           ("GB200", True), ("MI300X", False),
                                           ("H100 PCIe", False)])
def test_a_plan_says_whether_its_accelerator_had_held_out_runs(gpu: str, held: bool) -> None:
    best = {"pp": 4, "cp": 1, "dp_replicate": 1, "stage_layers": [7, 8, 8, 7]}
    acc = plan_accuracy(gpu, "bf16", True, "megatron", False, 64, best)
    assert acc["accelerator_held_out"] is held and acc["dtype_held_out"]
    assert acc["curve_fitted"]
    names = {s["slice"] for s in acc["slices"]}
    assert {"pipeline parallel", "uneven pipeline stages", "Megatron-LM / NeMo"} <= names
    # fp32 on a GPU is in no dtype slice, and says so.
    fp32 = plan_accuracy(gpu, "fp32", True, None, True, 8, {"pp": 1})
    assert not fp32["dtype_held_out"] and not {s["slice"] for s in fp32["slices"]} & {
        *DTYPE_SLICES, "dense"}


def test_every_dtype_policy_lands_in_the_slice_of_its_linear_layers() -> None:
    # A plan passes its policy's linear_compute, as a published run's dtype does.
    expected = {"bf16": "bf16 / fp16", "fp16": "bf16 / fp16", "amp-bf16": "bf16 / fp16",
                "bf16-pure": "bf16 / fp16", "fp8": "fp8", "fp32": None, "fp64": None}
    assert set(expected) == set(POLICIES)
    for name, want in expected.items():
        t = Traits("H100 SXM", get_policy(name).linear_compute, None, False, 8)
        got = [s["slice"] for s in accuracy(t) if s["slice"] in DTYPE_SLICES]
        assert got == ([want] if want else []), name


def test_an_even_split_given_explicitly_is_not_uneven() -> None:
    assert uneven((7, 8, 8, 7)) and not uneven((8, 8, 8, 8)) and not uneven(())
    acc = plan_accuracy("H100 SXM", "bf16", True, None, False, 64,
                        {"pp": 4, "stage_layers": [8, 8, 8, 8]})
    assert "uneven pipeline stages" not in {s["slice"] for s in acc["slices"]}


def test_a_moe_layout_with_many_experts_a_rank_carries_the_warning_slice() -> None:
    warning = "MoE, 8 or more experts a rank"
    # Megatron-Core's Qwen3-235B at EP 8 (16 experts a rank) and at EP 32 (4).
    assert warning in {s["slice"] for s in accuracy(_run("ZQ Qwen3-235B TP4 PP8 EP8"))}
    assert warning not in {s["slice"] for s in accuracy(_run("ZQ Qwen3-235B TP2 PP8 EP32"))}
    assert warning not in {s["slice"] for s in accuracy(_run("TT-1 8B FSDP8 eager"))}
    # A plan's winner: 128 experts over its ep.
    best = {"pp": 16, "cp": 1, "dp_replicate": 1, "ep": 8}
    for ep, warned in ((8, True), (16, True), (32, False)):
        got = plan_accuracy("H100 SXM", "bf16", True, "megatron", True, 256,
                            {**best, "ep": ep}, experts=128)
        assert (warning in {s["slice"] for s in got["slices"]}) is warned
    runs, _, mean, _ = HELD_OUT[warning]
    assert runs >= 5 and mean < 0  # what it warns of: such runs ran slower than predicted
    # Shown as a warning, not as a score: flagged in JSON, named so in the printed line.
    got = plan_accuracy("H100 SXM", "bf16", True, "megatron", True, 256, best, experts=128)
    slices = {s["slice"]: s for s in got["slices"]}
    assert slices[warning]["warning"] and not slices["MoE"]["warning"]
    line = accuracy_line(got, "H100 SXM", "bf16")
    assert f"warning: {warning} " in line and "warning: MoE 11" not in line
