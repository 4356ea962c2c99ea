"""Megatron-Core's selective recompute by module (``recompute=selective`` with
``recompute_modules=core_attn+layernorm+moe_act``): what each drops and what it costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardlab.cli import main
from shardlab.config.catalog import get_model
from shardlab.estimate.activations import layer_activation_bytes
from shardlab.estimate.expert import routed_rows, routed_tokens

QWEN = get_model("qwen3-30b-a3b")  # h 2048, 128 experts top 8, expert f 768, SwiGLU


def _bytes(moe: bool, modules: tuple[str, ...], flash: bool = True, **kw: object) -> float:
    return layer_activation_bytes(QWEN, 2, 4096, 2, recompute="selective", dropout=False,
                                  moe_layer=moe, flash=flash, modules=modules, **kw)


def test_moe_act_drops_the_experts_down_projection_input() -> None:
    rows = routed_rows(QWEN, routed_tokens(2, 4096, 1, False, 1), 1, 0.0, 1.0)
    assert rows == 2 * 4096 * 8  # every assignment of the rank's tokens, dropless
    drop = _bytes(True, ()) - _bytes(True, ("moe_act",))
    assert drop == pytest.approx(rows * 768 * 2, rel=1e-12)


def test_layernorm_drops_a_moe_layers_pre_mlp_norm_output_only() -> None:
    assert _bytes(True, ()) - _bytes(True, ("layernorm",)) == pytest.approx(
        2 * 4096 * 2048 * 2, rel=1e-12)
    # Transformer Engine fuses a dense layer's norms into its linear layers: nothing dropped.
    assert _bytes(False, ("layernorm", "moe_act")) == _bytes(False, ())


def test_without_core_attn_an_unfused_attention_core_is_kept() -> None:
    assert _bytes(False, ("moe_act",), flash=False) > _bytes(False, ("core_attn",), flash=False)
    assert _bytes(False, ("core_attn",), flash=False) == _bytes(False, (), flash=False)


def _plan(capsys: pytest.CaptureFixture[str], extra: str) -> dict:
    argv = ["plan", "qwen3-30b-a3b", "--gpus", "16", "--global-batch", "512", "--seq", "4096",
            "--framework", "megatron", "--json", "--layout",
            "dp=8 pp=2 ep=8 micro_batch=2 zero=1 recompute=selective" + extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["best"][0]


def test_the_modules_trade_memory_for_memory_bound_time(
        capsys: pytest.CaptureFixture[str]) -> None:
    plain = _plan(capsys, "")
    light = _plan(capsys, " recompute_modules=moe_act+layernorm")
    assert light["memory_breakdown"]["activations"] < 0.9 * plain["memory_breakdown"][
        "activations"]
    # The norm and the activation run again (memory-bound); the attention core does not.
    both = _plan(capsys, " recompute_modules=core_attn+moe_act+layernorm")
    assert both["breakdown"]["recompute"] > light["breakdown"]["recompute"] > 0


@pytest.mark.parametrize(("extra", "words"), [
    (["--layout", "dp=16 recompute=selective recompute_modules=shared_experts"], "not priced"),
    (["--layout", "dp=16 recompute=none recompute_modules=moe_act"], "recompute=selective"),
    (["--framework", "torchtitan", "--layout", "recompute_modules=moe_act"], "torchtitan"),
    (["--recompute", "none", "--layout", "recompute_modules=moe_act"], "recompute=selective"),
    (["--gpu", "cpu", "--layout", "recompute_modules=core_attn"], "shardlab train"),
])
def test_bad_modules_are_one_line(capsys: pytest.CaptureFixture[str], extra: list[str],
                                  words: str, cpu_home: Path) -> None:
    # cpu_home: `--gpu cpu` reads a stored measurement, never this user's own.
    code = main(["plan", "qwen3-30b-a3b", "--gpus", "16", "--global-batch", "32", *extra])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "recompute_modules" in err and words in err


def test_moe_modules_on_a_dense_model_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16", "--layout",
                 "dp=8 recompute=selective recompute_modules=moe_act"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "dense" in err


def test_moe_drops_the_whole_moe_layer_and_runs_it_and_its_all_to_alls_again(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Megatron-Core's ``moe``: the routed activations and the shared experts' hidden are not
    # kept (the layer's input is); a dense layer is untouched.
    routed = _bytes(True, ()) - _bytes(True, ("moe",))
    assert routed > _bytes(True, ()) - _bytes(True, ("moe_act",)) > 0
    assert _bytes(False, ("moe",)) == _bytes(False, ())
    plain = _plan(capsys, "")
    whole = _plan(capsys, " recompute_modules=moe")
    assert whole["memory_breakdown"]["activations"] < plain["memory_breakdown"]["activations"]
    assert whole["breakdown"]["recompute"] > plain["breakdown"]["recompute"]
    # Dispatch and combine three times, not twice (forward, the recompute, backward).
    assert whole["breakdown"]["ep_comm"] == pytest.approx(1.5 * plain["breakdown"]["ep_comm"],
                                                          rel=1e-9)
    # moe_act beside moe runs nothing more: the whole layer's rerun holds the activation.
    also = _plan(capsys, " recompute_modules=moe+moe_act")
    assert also["breakdown"]["recompute"] == pytest.approx(whole["breakdown"]["recompute"],
                                                           rel=1e-12)


def test_moe_with_the_all_to_all_overlap_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Megatron-Core asserts that a MoE layer is not recomputed under the EP overlap.
    code = main(["plan", "qwen3-30b-a3b", "--gpus", "16", "--global-batch", "32",
                 "--framework", "megatron", "--layout",
                 "dp=16 ep=8 recompute=selective recompute_modules=moe overlap_ep=1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "overlap_ep" in err
