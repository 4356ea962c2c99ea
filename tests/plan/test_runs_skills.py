"""Megatron-Bridge's expert-parallel-overlap skill runs (plan/runs_skills.py), a transcription
check: each row's step and TFLOP/s give one job's FLOPs, and that job is Qwen3-30B-A3B's
training FLOPs as Megatron-Bridge counts them."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from shardlab.estimate.flops import flops_per_token
from shardlab.plan.published import RUNS
from shardlab.plan.runs_skills import SKILL_RUNS


def test_both_rows_are_one_job_at_the_printed_rates() -> None:
    assert [r.name for r in SKILL_RUNS] == ["MSK Qwen3-30B-A3B EP16 overlap off",
                                            "MSK Qwen3-30B-A3B EP16 overlap on"]
    assert all(r in RUNS and r.role == "validation" for r in SKILL_RUNS)
    rates = {r.name: float(r.measured_from.split("(")[1].split()[0]) for r in SKILL_RUNS}
    per_step = [r.measured_step * rates[r.name] * r.gpus for r in SKILL_RUNS]
    # 24.7138 s at 244.039 and 21.0725 s at 286.208 TFLOP/s: one count of FLOPs, to the
    # printed digits (and the validation run's 20.9920 s at 287.305 the same).
    assert per_step[0] == pytest.approx(per_step[1], rel=1e-5)
    assert per_step[0] == pytest.approx(20.9920 * 287.305 * 16, rel=1e-5)
    r = SKILL_RUNS[0]
    tokens = r.global_batch * r.seq
    # Ours less half the attention core (their causal count) and the router's matmul
    # (2·h·E a token and layer, 3 passes): their figure to 0.01%.
    f = flops_per_token(r.model, r.seq)
    moe = r.model.moe
    assert moe is not None
    router = 3 * 2 * r.model.moe_layers * r.model.d_model * moe.experts
    ours = f.train - 3 * f.attention / 2 - router
    assert per_step[0] * 1e12 / tokens == pytest.approx(ours, rel=1e-4)


def test_only_the_overlap_differs() -> None:
    off, on = SKILL_RUNS
    assert on.options == off.options + " overlap_ep=1"
    same = ("name", "options", "measured_step", "measured_from", "checked")
    a, b = asdict(off), asdict(on)
    assert {k: v for k, v in a.items() if k not in same} == {
        k: v for k, v in b.items() if k not in same}
    assert (off.gpus, off.tp, off.pp, off.ep, off.micro_batch, off.global_batch, off.seq,
            off.dtype) == (16, 1, 1, 16, 1, 1024, 4096, "bf16")
