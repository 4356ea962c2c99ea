"""Latent attention (DeepSeek's MLA) in the estimators: its linear layers, FLOPs, KV cache,
saved activations, tensor-parallel split and fp8 casts; and a model without it unchanged
(its linears are the four Q, K, V and output matrices of the older formulas)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose

from shardlab.config.catalog import get_model
from shardlab.config.hardware import get_accelerator
from shardlab.config.model import MLA, ModelShape, MoE
from shardlab.errors import SpecError
from shardlab.estimate.activations import activation_terms, op_checkpoint_saves
from shardlab.estimate.context import kv_width
from shardlab.estimate.flops import attention_core_flops_per_token, layer_matmul_weights
from shardlab.estimate.fp8 import attention_cast_widths, linear_weights
from shardlab.estimate.inference import decode_attention_flops_per_token, kv_bytes_per_token
from shardlab.estimate.operators import layer_operators
from shardlab.estimate.params import attention_params
from shardlab.estimate.partition import layer_params_per_tp_rank

V3 = get_model("deepseek-v3")
H, HEADS = 7168, 128


def test_a_v3_layer_has_five_projections_two_of_them_whole_on_every_rank() -> None:
    shapes = [(x.name, x.d_in, x.d_out, x.split) for x in V3.attention_linears]
    assert shapes == [("q_down", H, 1536, "duplicated"), ("q_up", 1536, HEADS * 192, "column"),
                      ("kv_down", H, 576, "duplicated"),
                      ("kv_up", 512, HEADS * 256, "column"), ("o", HEADS * 128, H, "row")]
    # By hand: 7168*1536 + 1536*24576 + 7168*576 + 512*32768 + 16384*7168, norms 1536 + 512.
    assert attention_params(V3) == 187_107_328
    assert (V3.q_dim, V3.kv_dim, V3.v_dim, V3.o_dim) == (24576, 24576, 16384, 16384)


def test_a_model_without_latent_attention_keeps_its_four_matrices() -> None:
    m = get_model("llama-3-8b")
    assert [x.split for x in m.attention_linears] == ["column"] * 3 + ["row"]
    h, q, kv = m.d_model, m.q_dim, m.kv_dim
    assert attention_params(m) == h * q + 2 * h * kv + q * h
    assert (m.v_dim, m.o_dim) == (kv, q)
    t = np.array([1.0, 4.0])
    inputs, grads = attention_cast_widths(m, t, np.array([False, True]))
    assert_allclose(inputs, [h + q, h / 4 + q / 4], rtol=1e-12)
    assert_allclose(grads, [q + 2 * kv + h, (q + 2 * kv) / 4 + h], rtol=1e-12)


def test_the_core_scores_at_the_key_width_and_sums_at_the_value_width() -> None:
    seq = 4096
    # 2·s·heads·(192 + 128) per layer and token, over 61 layers; causal halves it.
    assert attention_core_flops_per_token(V3, seq) == 2 * 61 * seq * HEADS * 320
    assert attention_core_flops_per_token(V3, seq, causal=True) == 61 * seq * HEADS * 320
    dense = layer_matmul_weights(V3, moe_layer=False)
    assert dense == 187_107_328 - 1536 - 512 + 3 * H * 18432


def test_the_cache_holds_the_latent_and_decode_attends_over_it() -> None:
    # DeepSeek-V2 Table 1: (d_c + d_h^R)·l elements a token: (512 + 64) x 61 x 2 bytes.
    assert kv_bytes_per_token(V3) == 70_272
    # Absorbed: scores over 512 + 64, sums over 512, per head.
    assert decode_attention_flops_per_token(V3, 1000) == 2 * 61 * 1000 * HEADS * (1024 + 64)
    llama = get_model("llama-3-8b")
    assert decode_attention_flops_per_token(llama, 1000) == attention_core_flops_per_token(
        llama, 1000)


def test_saved_activations_count_q_k_v_output_and_the_latents() -> None:
    t = activation_terms(V3, 1, 4096, 2, dropout=False)
    sb = 4096
    mlp = 3 * 2 * 18432  # the dense MLP's gate and up outputs and down input
    assert t.inside_tp == sb * (2 * (24576 + 24576 + 16384 + 16384) + mlp)
    latents = 2 * (1536 + 512 + 64) + 2 * (1536 + 512)
    assert t.outside_tp == sb * (H * 2 * 4 + latents)
    # torchtitan's per-op policy counts its five projections then the MLP's three.
    assert op_checkpoint_saves(V3) == (True, False, True, False, True, False, True, False)


def test_tensor_parallel_splits_the_up_projections_not_the_down_ones() -> None:
    lite = get_model("deepseek-v2-lite")
    whole = layer_params_per_tp_rank(lite, 1, moe_layer=False)
    half = layer_params_per_tp_rank(lite, 2, moe_layer=False)
    duplicated = 2048 * 576 + 512  # kv_down and its latent's norm (no query latent)
    assert whole - half == (whole - duplicated - 2 * 2048) // 2
    assert linear_weights(V3, 8, False) == (
        H * 1536 + H * 576 + (1536 * 24576 + 512 * 32768 + 16384 * H) // 8 + 3 * H * 18432 // 8)
    # A context-parallel ring passes every head's decompressed K and V.
    assert kv_width(V3, 2) == 64 * (192 + 128)


def test_operators_list_each_projection_and_the_value_width() -> None:
    ops = {o.name: o for o in layer_operators(V3, get_accelerator("H100 SXM"), 1, 4096, 4096)}
    assert {"q_down projection", "q_up projection", "kv_down projection",
            "kv_up projection"} <= set(ops)
    assert ops["scores·V"].roofline.flops == 2 * 4096 * 4096 * 16384
    assert ops["output projection"].roofline.flops == 2 * 4096 * 16384 * H


@pytest.mark.parametrize(("kw", "field"), [
    ({"kv_heads": 8}, "kv_heads"), ({"head_dim": 128}, "head_dim"),
    ({"style": "gpt"}, "style"), ({"qkv_bias": True}, "qkv_bias"),
    ({"qk_norm": True}, "qk_norm"),
])
def test_latent_attention_needs_a_head_per_key(kw: dict, field: str) -> None:
    with pytest.raises(SpecError) as e:
        ModelShape("t", 2, 256, 4, 100, 64, mla=MLA(32, 16, 8, 16),
                   **{"style": "llama", **kw})
    assert e.value.field == field


@pytest.mark.parametrize("bad", [{"kv_lora_rank": 0}, {"v_head_dim": -1},
                                 {"q_lora_rank": -2}])
def test_bad_latent_widths_name_the_field(bad: dict) -> None:
    base = {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
            "v_head_dim": 16}
    with pytest.raises(SpecError) as e:
        MLA(**{**base, **bad})
    assert e.value.field == f"mla.{next(iter(bad))}"


def test_a_small_latent_shape_describes_itself() -> None:
    m = ModelShape("t", 2, 256, 4, 100, 64, style="llama", mla=MLA(32, 16, 8, 16, 64),
                   moe=MoE(4, 2, 64))
    assert m.head_dim == 24 and m.kv_heads == 4
    assert "mla=kv32/q64/rope8/v16" in m.describe()
