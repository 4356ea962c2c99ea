"""Megatron-Core's ``mla_up_proj`` and ``mlp`` recompute modules (DeepSeek-V3's recipes):
latent attention's Q, K and V dropped and projected again from the kept latents; a dense
layer's MLP checkpointed and run again; each refused where the model has no such part."""

from __future__ import annotations

import json

import pytest

from shardlab.cli import main
from shardlab.config.catalog import get_model
from shardlab.estimate.activations import layer_activation_bytes

LITE = get_model("deepseek-v2-lite")  # 16 heads, q/k 192 and v 128 per head; d_ff 10944


def _bytes(moe: bool, modules: tuple[str, ...]) -> float:
    return layer_activation_bytes(LITE, 1, 4096, 2, recompute="selective", dropout=False,
                                  moe_layer=moe, flash=True, modules=modules)


def test_mla_up_proj_drops_q_k_and_v_and_mlp_a_dense_layers_hidden() -> None:
    qkv = 4096 * 2 * (16 * 192 + 16 * 192 + 16 * 128)
    assert _bytes(False, ()) - _bytes(False, ("mla_up_proj",)) == pytest.approx(qkv, rel=1e-12)
    assert _bytes(True, ()) - _bytes(True, ("mla_up_proj",)) == pytest.approx(qkv, rel=1e-12)
    # SwiGLU keeps gate and up outputs and the down projection's input: 3 x f at 2 bytes.
    assert _bytes(False, ()) - _bytes(False, ("mlp",)) == pytest.approx(
        4096 * 3 * 10944 * 2, rel=1e-12)
    assert _bytes(True, ("mlp",)) == _bytes(True, ())  # a MoE layer's MLP is not "mlp"


def _plan(capsys: pytest.CaptureFixture[str], modules: str) -> dict:
    argv = ["plan", "deepseek-v2-lite", "--gpus", "16", "--global-batch", "256", "--seq",
            "4096", "--framework", "megatron", "--json", "--layout",
            "dp=8 pp=2 ep=8 zero=1 recompute=selective" + modules]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["best"][0]


def test_each_module_trades_activations_for_recompute(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Against the same layout recomputing the MoE layers' norms only (a fused kernel's
    # backward recomputes half its core under any selective layout): each module adds its
    # own matmuls again and keeps fewer activations.
    base = " recompute_modules=layernorm"
    plain = _plan(capsys, base)
    for module in ("mla_up_proj", "mlp"):
        less = _plan(capsys, f"{base}+{module}")
        assert less["memory_breakdown"]["activations"] < plain["memory_breakdown"][
            "activations"], module
        assert less["breakdown"]["recompute"] > plain["breakdown"]["recompute"], module


@pytest.mark.parametrize(("model", "modules", "words"), [
    ("llama-3-8b", "mla_up_proj", "latent"), ("qwen3-30b-a3b", "mlp", "dense layer"),
])
def test_a_module_the_model_lacks_is_one_line(capsys: pytest.CaptureFixture[str], model: str,
                                              modules: str, words: str) -> None:
    code = main(["plan", model, "--gpus", "8", "--global-batch", "16", "--layout",
                 f"dp=8 recompute=selective recompute_modules={modules}"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err
