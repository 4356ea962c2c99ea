"""FlashAttention's own training runs (plan/runs_flash.py), a transcription check: each row's
step, turned back into the source's other printed figures (the chart's TFLOP/s, Lambda's
iterations per second), gives them back."""

from __future__ import annotations

import pytest

from shardlab.plan.runs_flash import FLASH_RUNS

# training/README.md at 4a6eaa9f: the chart's TFLOP/s per A100 for each table row, the
# README's formula being Megatron's x 3/4: 72·l·h²·(1 + s/6h + V/16lh) FLOPs per token.
CHART_TFLOPS = {"125M": 149, "355M": 167, "760M": 163, "1.3B": 189, "2.7B": 189}


def test_each_fa_row_gives_back_the_readme_chart() -> None:
    rows = [r for r in FLASH_RUNS if r.name.startswith("FA ")]
    assert len(rows) == len(CHART_TFLOPS)
    for r in rows:
        m, s = r.model, r.seq
        per_token = 72 * m.layers * m.d_model**2 * (
            1 + s / (6 * m.d_model) + 50257 / (16 * m.layers * m.d_model))
        tokens_per_gpu = r.global_batch * s / (r.measured_step * r.gpus)
        tflops = per_token * tokens_per_gpu / 1e12
        # The README rounds its tokens/s ("1310k", "85k") and its bars: 0.6% between them.
        assert tflops == pytest.approx(CHART_TFLOPS[r.name.split("-")[-1]], rel=0.006), r.name
        assert "flash_kernel=fa1" in r.options and r.recompute == "none"


def test_lambda_rows_are_iterations_times_tokens_per_iteration() -> None:
    # Tables 1 and 2: Tokens/Sec = Iter/Sec x 1024 x batch 4 x GPUs (2.5 and 5.34 it/s).
    rows = {r.gpu: r for r in FLASH_RUNS if r.name.startswith("LFA ")}
    assert set(rows) == {"A100 SXM 80GB", "H100 SXM"}
    for gpu, iters in (("A100 SXM 80GB", 2.5), ("H100 SXM", 5.34)):
        r = rows[gpu]
        assert r.global_batch * r.seq / r.measured_step == pytest.approx(
            iters * 1024 * 4 * r.gpus, rel=1e-9)
        assert (r.gpus, r.micro_batch, r.dtype) == (8, 4, "fp16")
