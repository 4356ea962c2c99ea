"""Latent attention (DeepSeek's MLA) in the step-time model and the search: each projection
timed at its own shape (a duplicated down projection on the rank's s/t tokens under
sequence parallelism), the core at the key and value widths; budget and plan price
DeepSeek-V3, and the runtime commands refuse it with one line."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.cli.budget_cli_support import assert_one_line_error, run_cli

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.plan.efficiency import matmul_seconds
from shardlab.plan.layer_time import layer_forward
from shardlab.plan.search import device_of, layout_candidates, plan
from shardlab.plan.space import Space

H100 = get_accelerator("H100 SXM")
LITE = get_model("deepseek-v2-lite")


@pytest.mark.parametrize("sp", [False, True])
def test_each_projection_at_its_own_shape(sp: bool) -> None:
    dev = device_of(H100, get_policy("bf16"), 8)[0]
    bare = replace(dev, eff=replace(dev.eff, op_overhead=0.0))
    c = layout_candidates(LITE, Space(gpus=8, global_batch=8, seq=4096),
                          f"tp=2 dp=4 ep=4 sp={int(sp)}")
    layer = layer_forward(LITE, 4096, c.tp, c.micro_batch, bare, moe_layer=False, c=c)
    rows = 4096.0

    def mat(m: float, k: float, n: float) -> float:
        return float(matmul_seconds(2 * m * k * n, m, k, n, bare.peak, bare.eff))

    down_rows = rows / 2 if sp else rows  # kv_down: whole weights, the rank's own tokens
    attn = (mat(rows, 2048, 16 * 192 / 2) + mat(down_rows, 2048, 576)
            + mat(rows, 512, 16 * 256 / 2) + mat(rows, 16 * 128 / 2, 2048))
    mlp = mat(rows, 2048, 2 * 10944 / 2) + mat(rows, 10944 / 2, 2048)  # gate+up fused
    assert float(layer.matmul[0]) == pytest.approx(attn + mlp, rel=1e-12)


def test_plan_searches_a_latent_moe_model() -> None:
    result = plan(LITE, H100, Space(gpus=16, global_batch=64, seq=4096), get_policy("bf16"),
                  top=3)
    best = result.best[0]
    assert best["fits"] and best["step_seconds"] > 0


def test_budget_and_plan_price_deepseek_v3(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "budget", "deepseek-v3", "--gpu", "h100", "--gpus", "1024",
                           "--pp", "16", "--ep", "64", "--seq", "4096", "--json")
    assert code == 0
    assert '"kv_bytes_per_token": 70272' in out
    code, out, _ = run_cli(capsys, "plan", "deepseek-v3", "--gpu", "h100", "--gpus", "1024",
                           "--seq", "4096", "--global-batch", "8192", "--layout",
                           "tp=1 pp=16 dp=64 ep=64 recompute=full zero=1")
    assert code == 0 and "deepseek-v3" in out


@pytest.mark.parametrize("command", ["train", "simulate"])
def test_the_runtime_refuses_latent_attention(capsys: pytest.CaptureFixture[str],
                                             command: str) -> None:
    assert_one_line_error(*run_cli(capsys, command, "deepseek-v2-lite"), "latent attention")
