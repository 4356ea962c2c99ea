"""DeepSeek-V3's published runs: each row's figure is its source's, its layout places the
62 layers (61 and the multi-token-prediction depth) as its config does, its FLOPs are the
source's own count, and the docs' figures for them are what the runs give."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from shardlab.estimate.flops import flops_per_token
from shardlab.plan.published import errors, predict
from shardlab.plan.runs_deepseek import DEEPSEEK_RUNS, DSV3_MTP

ROOT = Path(__file__).resolve().parents[2]

# Each row's published model TFLOP/s per GPU beside the throughput it was measured at.
TFLOPS = {"DGXC DeepSeek-V3 H100 1024": 163.7, "DGXC DeepSeek-V3 H100 1024 v25.08": 235.43,
          "DGXC DeepSeek-V3 GB200 256": 249.11,
          "DGXC DeepSeek-V3 GB200 256 v25.10": 769.50, "MBG DeepSeek-V3 H100 1024 FP8": 338,
          "MBG DeepSeek-V3 GB200 256 FP8": 899, "MBG DeepSeek-V3 B200 256 FP8": 589,
          "MBG DeepSeek-V3 GB200 256 MXFP8": 1028, "MBG DeepSeek-V3 B200 256 MXFP8": 699,
          "MBG DeepSeek-V3 B200 256 MXFP8 EP32": 864}


def test_every_row_quotes_its_figure_and_places_62_layers() -> None:
    assert {r.name for r in DEEPSEEK_RUNS} == set(TFLOPS)
    for r in DEEPSEEK_RUNS:
        assert r.model is DSV3_MTP and r.model.layers == 62 and r.model.mtp_layers == 1
        assert sum(r.stage_layers) == 62 and len(r.stage_layers) == r.pp * r.virtual, r.name
        assert r.role == "validation"
        assert "recompute_modules=mla_up_proj" in r.options or "core_attn" in r.options
        if r.name.startswith("DGXC"):
            quoted = r.measured_from.split()[-2].replace(",", "")
            assert float(quoted) == pytest.approx(r.measured_step * (
                1000 if "ms" in r.measured_from else 1)), r.name
        else:
            tokens = float(r.measured_from.split()[0].replace(",", ""))
            assert r.measured_step == pytest.approx(
                r.global_batch * 4096 / (r.gpus * tokens), rel=1e-12)
            assert f"| {tokens:.0f} " in r.checked.replace(",", ""), r.name


def test_only_the_blackwell_run_before_te_2_5_is_priced_unfused() -> None:
    """Transformer Engine fuses latent attention's head dims (q/k 192, v 128) for training
    on Blackwell only from cuDNN 9.11 (TE PR #1797, TE 2.5): NeMo 25.04's GB200 run fell
    back to its unfused attention, and its recipe alone recomputes the core (core_attn).
    Every later or Hopper row runs the fused kernel."""
    unfused = [r for r in DEEPSEEK_RUNS if not r.flash]
    assert [r.name for r in unfused] == ["DGXC DeepSeek-V3 GB200 256"]
    run = unfused[0]
    assert "recompute_modules=core_attn" in run.options and "TE 2.5" in " ".join(run.assumed)
    # The materialised scores cost time: the same layout with the fused kernel is faster.
    assert predict(replace(run, flash=True))["step_seconds"] < 0.8 * predict(run)["step_seconds"]


def test_the_sources_count_our_flops_less_the_router() -> None:
    """NVIDIA's model FLOPs (Megatron-Bridge/NeMo: causal attention, the MTP depth as one
    more MoE layer, its projection and head) are the planner's with causal attention less
    the router's matmul, 3 x 2·h·E a token in each of the 59 MoE layers: every row's
    TFLOP/s over its tokens/s gives it within 0.3%."""
    m = DSV3_MTP
    router = 3 * 2 * m.d_model * m.moe.experts * m.moe_layers
    ours = flops_per_token(m, 4096, causal=True).train - router
    for r in DEEPSEEK_RUNS:
        tokens = r.global_batch * 4096 / (r.gpus * r.measured_step)
        assert TFLOPS[r.name] * 1e12 / tokens == pytest.approx(ours, rel=3e-3), r.name


def test_docs_state_the_deepseek_figures() -> None:
    errs = errors(list(DEEPSEEK_RUNS))
    without = np.mean([abs(e) for r, e in zip(DEEPSEEK_RUNS, errs, strict=True)
                       if r.name != "DGXC DeepSeek-V3 GB200 256"])
    readme = (ROOT / "README.md").read_text()
    doc = (ROOT / "docs" / "validation.md").read_text()
    assert f"{np.mean(np.abs(errs)):.1%}, {-np.mean(errs):.1%} fast on" in " ".join(
        readme.split())
    assert f"{without:.1%} without the NeMo 25.04 GB200 run" in " ".join(readme.split())
    for r, e in zip(DEEPSEEK_RUNS, errs, strict=True):
        assert f"{e:+.1%}" in doc, r.name
    # The NeMo 25.04 GB200 run, priced unfused (its container's Transformer Engine had no
    # fused kernel for latent attention's head dims on Blackwell), is the README's second worst.
    gb200 = -dict(zip((r.name for r in DEEPSEEK_RUNS), errs, strict=True))[
        "DGXC DeepSeek-V3 GB200 256"]
    assert f"next, {gb200:.1%}, DeepSeek-V3 on 256 GB200" in " ".join(readme.split())
    # The plan guide's example is the 25.09 H100 run in its own layout.
    guide = " ".join((ROOT / "docs" / "guide" / "plan.md").read_text().split())
    h100 = {r.name: e for r, e in zip(DEEPSEEK_RUNS, errs, strict=True)}
    assert f"the planner is {-h100['MBG DeepSeek-V3 H100 1024 FP8']:.1%} fast" in guide
    assert f"NeMo 25.04 H100 run ({h100['DGXC DeepSeek-V3 H100 1024']:+.1%})" in guide
    assert f"prices {h100['DGXC DeepSeek-V3 H100 1024 v25.08']:.1%} slow" in guide
