"""fp8: which matmuls, the share of FLOPs they carry, the copies and scales they hold."""

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.layout import make_layout
from shardlab.config.model import ModelShape, MoE
from shardlab.estimate import fp8
from shardlab.estimate.comm import tensor_rows
from shardlab.estimate.flops import flops_per_token
from shardlab.estimate.memory import stage_memory
from shardlab.estimate.params import attention_params, mlp_params


def test_linear_weights_are_the_attention_and_mlp_matrices() -> None:
    m = get_model("llama-3-8b")  # no biases: every attention and MLP weight is linear
    assert fp8.linear_weights(m, 1, False) == attention_params(m) + mlp_params(m, m.d_ff)
    assert fp8.linear_weights(m, 8, False) * 8 == fp8.linear_weights(m, 1, False)
    mix = get_model("mixtral-8x7b")
    routed = 8 * 3 * 4096 * 14336
    assert fp8.linear_weights(mix, 1, True, ep=2, etp=1) == attention_params(mix) + routed // 2


def test_linear_share_leaves_the_core_head_and_router_in_bf16() -> None:
    m = get_model("llama-3-70b")
    f = flops_per_token(m, 8192)
    share = fp8.linear_flop_share(m, 8192)
    assert share == pytest.approx((f.forward - f.attention - f.logits) / f.forward)
    assert 0.8 < share < 0.9
    assert fp8.blended_peak(989e12, 1979e12, 1.0) == pytest.approx(1979e12)
    assert 989e12 < fp8.blended_peak(989e12, 1979e12, share) < 1979e12


def test_copies_and_scales_on_each_rank_under_zero_0_to_2_only() -> None:
    m = get_model("llama-3-8b")
    policy = get_policy("fp8")
    assert policy.is_fp8 and policy.compute == "bf16" and policy.gather_bytes == 1
    for zero, held in ((1, True), (3, False)):
        lay = make_layout(m, gpus=16, dp=2, tp=2, pp=4, zero=zero, dtype="fp8", seq=1024)
        base = make_layout(m, gpus=16, dp=2, tp=2, pp=4, zero=zero, dtype="bf16", seq=1024)
        extra = [a.states.weights - b.states.weights
                 for a, b in zip(stage_memory(m, lay, False, True),
                                 stage_memory(m, base, False, True), strict=True)]
        per_layer = 2 * fp8.linear_weights(m, 2, False) + 36 * 4
        assert extra == pytest.approx([8 * per_layer if held else 0.0] * 4)


def test_casts_count_inputs_forward_and_output_gradients_backward() -> None:
    m = get_model("llama-3-8b")
    t, h, f = 4096.0, 4096, 14336
    fwd, bwd = fp8.cast_bytes(m, t, 1, False, 0.0)
    assert float(fwd) == pytest.approx(7 * t * (2 * h + m.q_dim + f))
    assert float(bwd) == pytest.approx(7 * t * (m.q_dim + 2 * m.kv_dim + 2 * f + 2 * h))
    fused, _ = fp8.cast_bytes(m, t, 1, False, 0.0, per_element=3)
    assert float(fused) == pytest.approx(3 / 7 * float(fwd))


def test_the_block_weights_that_multiply_in_fp8() -> None:
    """A Llama block's seven linear weights (q, k, v, o; gate, up, down as [out, in]), not
    its norm (1 wide); a dimension that is not a multiple of 16 keeps a weight in bf16."""
    shape = ModelShape("t", 2, 64, 4, 256, 32, style="llama", tied=False, d_ff=160)
    block = tensor_rows(shape, 1, vocab_parallel=False)[0]
    weights = list(fp8.tp_fp8_weights(shape, 1).values())
    assert sorted(weights) == sorted([(64, 64)] * 4 + [(160, 64)] * 2 + [(64, 160)])
    assert (64, 1) in block and (64, 1) not in weights
    # The same tensors as the block's rows that are linear weights (wider than 1).
    assert sorted(weights) == sorted(r for r in block if r[1] > 1)
    odd = ModelShape("t", 2, 64, 4, 256, 32, style="llama", tied=False, d_ff=168)
    assert len(fp8.tp_fp8_weights(odd, 1)) == 4
    assert fp8.fp8_matmul_fits(48, 16) and not fp8.fp8_matmul_fits(48, 24)


def test_the_linears_fp8_runs_per_tensor_parallel_rank() -> None:
    """Each rank's matmul must take fp8: a column-parallel linear's output width over tp, a
    row-parallel one's input width over tp, both multiples of 16."""
    m = ModelShape("t", 2, 64, 8, 512, 64, kv_heads=4, d_ff=128, style="llama", tied=False)
    every = {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj"}
    assert fp8.tp_fp8_linears(m, 1) == every
    assert fp8.tp_fp8_linears(m, 2) == every  # k, v: 32 / 2 = 16 columns a rank
    assert fp8.tp_fp8_linears(m, 4) == every - {"attn.k_proj", "attn.v_proj"}  # 8 columns
    gpt = ModelShape("g", 2, 64, 8, 512, 64, d_ff=96, style="gpt")
    assert fp8.tp_fp8_linears(gpt, 4) == {"attn.q_proj", "attn.k_proj", "attn.v_proj",
                                          "attn.o_proj"}  # 96 / 4 = 24 MLP columns


def test_a_moe_blocks_fp8_linears_under_tp() -> None:
    """A MoE block runs its attention and its shared experts' MLP (width shared_experts x
    shared_d_ff) in fp8; its router and routed experts stay bf16."""
    m = ModelShape("t", 2, 64, 8, 512, 64, kv_heads=4, d_ff=128, style="llama", tied=False,
                   moe=MoE(8, 2, 48, shared_experts=1, shared_d_ff=32))
    attn = {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj"}
    assert fp8.tp_fp8_linears(m, 2, moe_layer=True) == attn | {
        "mlp.shared.gate_proj", "mlp.shared.up_proj", "mlp.shared.down_proj"}
    assert fp8.tp_fp8_linears(m, 4, moe_layer=True) == {"attn.q_proj", "attn.o_proj"}
    assert fp8.row_parallel("mlp.shared.down_proj") and not fp8.row_parallel("mlp.up_proj")
