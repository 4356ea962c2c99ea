"""NVIDIA's dgxc-benchmarking rows (plan/runs_dgxc.py): the attention kernel each row's
container ran, as Transformer Engine 2.1-2.4 picks it, and what FlashAttention-2 costs on
Blackwell in the step-time model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from shardlab.config.hardware import FA2_BLACKWELL_SHARE, get_accelerator
from shardlab.plan.published import predict
from shardlab.plan.runs_dgxc import DGXC_RUNS


def test_flash_attention_2_on_blackwell_is_held_to_its_b200_benchmark() -> None:
    # tritonbench PR #171: FlashAttention-2's forward at head dim 128, 8K tokens, on a B200:
    # 361.6 TFLOP/s of the B200's 2,250 dense bf16.
    assert pytest.approx(0.1607, abs=5e-4) == FA2_BLACKWELL_SHARE
    for gpu in ("B200", "GB200"):
        shares = dict(get_accelerator(gpu).efficiency.flash_fractions)
        assert shares == {"fa2": FA2_BLACKWELL_SHARE}  # cuDNN's kernel keeps no cap
    # Half the H100's share of FlashAttention-2 (35%): the kernel runs Ampere's mma there.
    h100 = dict(get_accelerator("H100 SXM").efficiency.flash_fractions)
    assert h100["fa2"] / 2 > FA2_BLACKWELL_SHARE


def test_te_falls_back_to_flash_attention_2_above_head_dim_128_on_blackwell() -> None:
    by_name = {r.name: r for r in DGXC_RUNS}
    fa2 = {r.name for r in DGXC_RUNS if "flash_kernel=fa2" in r.options}
    # Exactly the Nemotron-4 340B rows on GB200 (head dim 18432 / 96 = 192): 6 bf16, 6 fp8.
    assert fa2 == {r.name for r in DGXC_RUNS
                   if r.gpu == "GB200" and r.model.head_dim > 128}
    assert len(fa2) == 12 and all("Nemotron4-340B GB200" in n for n in fa2)
    for name in fa2:
        assert any("FlashAttention-2" in a and "head dims <= 128" in a
                   for a in by_name[name].assumed)
    # The same model on H100 (cuDNN trains head dim 192 on sm90) and Llama 3.1 405B on
    # GB200 (head dim 128) keep the fused kernel.
    assert "flash_kernel" not in by_name["DGXC Nemotron4-340B H100 256"].options
    assert "flash_kernel" not in by_name["DGXC Llama3.1-405B GB200 256"].options


def test_the_fallback_slows_the_nemotron_gb200_step_by_its_attention() -> None:
    # FlashAttention-2 at 16% of the peak in place of the curve's share: each Nemotron
    # GB200 row slower by 8-10% (bf16) and 14-15% (fp8, where attention stays bf16 and
    # weighs more of the step), as priced now; the fp8 gain over bf16 falls with it.
    rows = [r for r in DGXC_RUNS if "flash_kernel=fa2" in r.options]
    for r in rows:
        # The planner's Megatron default on GB200 gives the same kernel without the key.
        plain = replace(r, options=r.options.replace(" flash_kernel=fa2", ""))
        assert predict(plain) == predict(r)
        fused = replace(r, options=r.options.replace("flash_kernel=fa2", "flash_kernel=fa3"))
        slower = predict(r)["step_seconds"] / predict(fused)["step_seconds"]
        band = (1.13, 1.16) if r.dtype == "fp8" else (1.08, 1.10)
        assert band[0] < slower < band[1], (r.name, slower)
    errs = np.array([predict(r)["step_seconds"] / r.measured_step - 1 for r in rows])
    assert np.abs(errs).mean() < 0.03 and np.abs(errs).max() < 0.07
