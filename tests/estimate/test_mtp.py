"""Multi-token prediction (DeepSeek-V3 Sec. 2.2; ``--mtp-layers``): the appended blocks are
layers like the others, and each depth adds its 2h -> h projection, three norms and one
more pass through the head; the last pipeline rank holds them and an embedding copy."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.cli.budget_cli_support import assert_one_line_error, run_cli

from shardlab.config.catalog import get_model
from shardlab.config.model import require_buildable, runtime_builds, with_mtp
from shardlab.errors import SpecError
from shardlab.estimate.activations import last_stage_extra_bytes
from shardlab.estimate.flops import (
    flops_per_token,
    layer_matmul_weights,
    matmul_weights_per_token,
)
from shardlab.estimate.params import count_params
from shardlab.estimate.partition import stage_params

V3 = get_model("deepseek-v3")


def test_a_depth_is_one_more_layer_its_projection_and_a_head_pass() -> None:
    m = with_mtp(V3, 1)
    h = V3.d_model
    assert (m.layers, m.mtp_layers, m.moe_layers) == (62, 1, 59)
    base, more = count_params(V3), count_params(m)
    moe_layer = (more.attention - base.attention) + (more.experts - base.experts) + (
        more.router - base.router) + (more.norms - base.norms)
    assert more.mtp == 2 * h * h + 3 * h
    assert more.total - base.total == moe_layer + more.mtp
    extra = matmul_weights_per_token(m) - matmul_weights_per_token(V3)
    assert extra == layer_matmul_weights(V3, True) + 2 * h * h + V3.vocab * h
    assert flops_per_token(m, 4096).train > flops_per_token(V3, 4096).train
    assert with_mtp(V3, 0) is V3


def test_the_last_rank_holds_the_depth_its_projection_and_an_embedding() -> None:
    m = with_mtp(V3, 1)
    split = (4, *[4] * 14, 2)
    one = stage_params(m, 1, 16, stage_layers=split)
    # Without multi-token prediction's extras: the same 62 layers, mtp_layers 0.
    plain = stage_params(replace(m, mtp_layers=0), 1, 16, stage_layers=split)
    assert one[:-1] == plain[:-1]
    h = V3.d_model
    assert one[-1] - plain[-1] == 2 * h * h + 3 * h + V3.vocab * h


def test_a_tied_head_is_the_depth_s_embedding_already() -> None:
    gpt = with_mtp(get_model("gpt2"), 1)  # tied: the last rank's head is the embedding
    one, plain = (stage_params(x, 1, 2) for x in (gpt, replace(gpt, mtp_layers=0)))
    h = gpt.d_model
    assert one[-1] - plain[-1] == 2 * h * h + 3 * 2 * h  # LayerNorm: scale and shift


def test_the_last_stage_keeps_each_depth_s_logits_and_inputs() -> None:
    m, seq, h = with_mtp(V3, 1), 4096, V3.d_model
    extra = last_stage_extra_bytes(m, 1, seq, 2) - last_stage_extra_bytes(V3, 1, seq, 2)
    # Its fp32 logits, its final norm's and head's inputs, its two norms' and its
    # projection's 2h-wide input.
    assert extra == 4 * seq * V3.vocab + (2 + 4) * seq * h * 2


def test_mtp_layers_must_leave_a_layer_and_the_runtime_refuses_them() -> None:
    with pytest.raises(SpecError) as e:
        replace(V3, mtp_layers=61)
    assert e.value.field == "mtp_layers"
    small = with_mtp(get_model("gpt2"), 1)
    assert not runtime_builds(small) and runtime_builds(get_model("gpt2"))
    with pytest.raises(SpecError, match="multi-token prediction"):
        require_buildable(small)


def test_budget_and_plan_take_mtp_layers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "budget", "deepseek-v3", "--gpus", "1024", "--pp", "16",
                           "--ep", "64", "--seq", "4096", "--mtp-layers", "1", "--json")
    assert code == 0 and '"mtp":102781952' in out.replace(" ", "")
    # Serving has no prediction depth: the cache is the 61 layers' latents.
    assert '"kv_bytes_per_token":70272' in out.replace(" ", "")
    assert_one_line_error(*run_cli(capsys, "budget", "--params", "7e9", "--mtp-layers", "1"),
                          "mtp_layers", "needs a MODEL")
    assert_one_line_error(*run_cli(capsys, "budget", "deepseek-v3", "--mtp-layers", "17"),
                          "--mtp-layers", "16")
    assert_one_line_error(*run_cli(capsys, "plan", "gpt2", "--gpus", "8", "--mtp-layers",
                                   "-1"), "--mtp-layers")
