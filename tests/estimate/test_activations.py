"""Activation memory: the term-by-term derivation reproduces Korthikanti et al. 2022 Table 2."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from shardlab.config.catalog import get_model
from shardlab.config.model import ModelShape
from shardlab.estimate.activations import (
    korthikanti_layer_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
)

CASES = [(sp, rc) for sp in (False, True) for rc in ("none", "selective", "full")]


@given(st.integers(1, 64), st.sampled_from([64, 128]), st.integers(1, 8),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from([256, 2048, 8192]))
@pytest.mark.parametrize(("sp", "recompute"), CASES)
def test_table2_every_combination(sp: bool, recompute: str, heads8: int, hd: int, b: int,
                                  t: int, s: int) -> None:
    a = heads8 * 8  # divisible by every t tried
    m = ModelShape("k", 1, a * hd, a, 50257, s, style="gpt")
    got = layer_activation_bytes(m, b, s, 2, tp=t, sp=sp, recompute=recompute, dropout=True)
    want = korthikanti_layer_bytes(s, b, m.d_model, a, t, sp, recompute)
    if recompute == "full" and sp:
        want /= t  # the kept layer input is sequence-sharded too (Megatron); Table 2 says 2sbh
    assert_close(got, want, rtol=1e-12, atol=0)


def test_gpt3_paper_example() -> None:
    # Korthikanti 2022 Sec. 4: 34 + 5as/h with a=96, s=2048, h=12288 is 34 + 80 = 114 sbh.
    m = get_model("gpt3-175b")
    got = layer_activation_bytes(m, 1, 2048, 2, dropout=True)
    assert got == 2048 * 12288 * 114


def test_llama_without_dropout_counts_gqa_and_swiglu() -> None:
    m = get_model("llama-3-8b")  # h 4096, q 4096, kv 1024, f 14336, 32 heads
    s, b, e = 8192, 1, 2
    inside = s * b * e * (2 * 4096 + 2 * 1024 + 3 * 14336)
    outside = s * b * 4096 * 4 * e
    core = 32 * s * s * b * 2 * e
    assert layer_activation_bytes(m, b, s, e, dropout=False) == outside + inside + core
    assert layer_activation_bytes(m, b, s, e, dropout=False, recompute="selective") == (
        outside + inside)


def test_fp32_activations_double_the_elements_not_the_masks() -> None:
    m = ModelShape("k", 1, 1024, 16, 1000, 512)
    two = layer_activation_bytes(m, 1, 512, 2, dropout=True)
    four = layer_activation_bytes(m, 1, 512, 4, dropout=True)
    masks = 2 * 512 * 1024 + 16 * 512 * 512  # two sbh masks + the as²b attention mask
    assert four - masks == 2 * (two - masks)


def test_logits_are_fp32_and_vocab_parallel() -> None:
    m = get_model("llama-3-8b")
    one = last_stage_extra_bytes(m, 1, 4096, 2, tp=1)
    eight = last_stage_extra_bytes(m, 1, 4096, 2, tp=8)
    assert one - 2 * 4096 * 4096 * 2 == 4 * 4096 * 128256
    assert eight - 2 * 4096 * 4096 * 2 == 4 * 4096 * 128256 / 8


@pytest.mark.parametrize("t", [1, 4])
def test_flash_attention_keeps_only_softmax_statistics(t: int) -> None:
    m = get_model("llama-3-8b")
    s, b = 8192, 2
    eager_sel = layer_activation_bytes(m, b, s, 2, tp=t, recompute="selective", dropout=False)
    flash = layer_activation_bytes(m, b, s, 2, tp=t, dropout=False, flash=True)
    assert flash == eager_sel + 4 * 32 * s * b / t


def test_op_checkpointing_keeps_the_input_every_other_matmul_and_the_kernel_output() -> None:
    from shardlab.estimate.activations import op_checkpoint_layer_bytes, op_checkpoint_saves

    m = get_model("llama-3-8b")  # h 4096, q 4096, kv 1024, f 14336, 32 heads
    # q, k, v, out, gate, up, down: q, v, gate and down saved (torchtitan's every other mm).
    assert op_checkpoint_saves(m) == (True, False, True, False, True, False, True)
    b, s = 2, 8192
    by_hand = 2 * b * s * (4096 + 4096 + 1024 + 4096 + 14336 + 4096) + 4 * 32 * b * s
    assert_close(op_checkpoint_layer_bytes(m, b, s), float(by_hand), rtol=1e-12, atol=0)
    # Tensor + sequence parallel: every saved tensor split by t but the down projection's
    # output before its reduce-scatter; the two reduce-scatters' outputs are added.
    t = 8
    split = 2 * b * s * ((4096 + 4096 + 1024 + 4096 + 14336) / t + 4096 + 2 * 4096 / t)
    assert_close(op_checkpoint_layer_bytes(m, b, s, tp=t, sp=True),
                 split + 4 * 32 * b * s / t, rtol=1e-12, atol=0)
    # Less than half of what Korthikanti's selective recompute keeps for this model.
    kept = layer_activation_bytes(m, b, s, recompute="selective", dropout=False, flash=True)
    assert op_checkpoint_layer_bytes(m, b, s) < 0.5 * kept


@pytest.mark.parametrize(("t", "sp"), [(1, False), (4, False), (4, True)])
def test_transformer_engine_fp8_keeps_linear_inputs_in_one_byte(t: int, sp: bool) -> None:
    # TE saves the fp8 copy of each linear input (QKV and MLP inputs, the down projection's
    # input) and the output projection's fp8 copy beside the attention kernel's bf16 output.
    m = get_model("llama-3-8b")  # h 4096, q 4096, f 14336
    s, b = 4096, 2
    kw = {"tp": t, "sp": sp, "dropout": False, "flash": True}
    bf16 = layer_activation_bytes(m, b, s, 2, **kw)
    fp8 = layer_activation_bytes(m, b, s, 2, input_bytes=1, **kw)
    outside = 2 * s * b * 4096 / (t if sp else 1)  # QKV and MLP inputs: 2 -> 1 B each
    inside = s * b * (14336 - 4096) / t  # down input 2 -> 1 B, the projection's copy + 1 B
    assert_close(bf16 - fp8, outside + inside, rtol=1e-12, atol=0)
    # A GELU MLP keeps the first matmul's output at 2 B and the second's input at 1 B.
    g = get_model("gpt3-175b")
    gelu = layer_activation_bytes(g, 1, 2048, 2, dropout=True, flash=True)
    g8 = layer_activation_bytes(g, 1, 2048, 2, dropout=True, flash=True, input_bytes=1)
    assert_close(gelu - g8, 2048.0 * (2 * 12288 + 4 * 12288 - 12288), rtol=1e-12, atol=0)
