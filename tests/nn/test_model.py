"""The torch LM: parameter count equal to the cost model's, padding-aware causal attention."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from shardlab.config.catalog import get_model
from shardlab.config.model import ModelShape, MoE
from shardlab.estimate.params import count_params
from shardlab.nn.mlp import MLP
from shardlab.nn.model import TransformerLM, apply_rope, numel, rope_tables
from shardlab.nn.moe import GroupedExperts, MoEFeedForward

shapes = st.builds(
    lambda style, layers, kvh, group, hd, ff, vocab, ctx, tied, qkv: ModelShape(
        "h", layers, kvh * group * hd, kvh * group, vocab, ctx, kv_heads=kvh, d_ff=ff,
        style=style, tied=tied, qkv_bias=qkv and style == "llama"),
    st.sampled_from(["gpt", "llama"]), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3),
    st.sampled_from([4, 8]), st.integers(1, 40), st.integers(3, 60), st.integers(1, 20),
    st.booleans(), st.booleans())


@given(shapes)
def test_numel_equals_cost_model(shape: ModelShape) -> None:
    assert numel(TransformerLM(shape)) == count_params(shape).total


def test_a_catalog_shape_cut_to_two_layers() -> None:
    big = get_model("qwen2.5-7b")  # GQA, qkv biases, untied head, explicit sizes
    cut = ModelShape("q", 1, big.d_model // 14, big.heads // 7 * 2, 1000, 64,
                     kv_heads=big.kv_heads // 2, d_ff=big.d_ff // 16, style="llama", tied=False,
                     qkv_bias=True)
    assert numel(TransformerLM(cut)) == count_params(cut).total


def test_tied_head_shares_the_embedding() -> None:
    m = TransformerLM(ModelShape("t", 1, 16, 2, 50, 8, style="gpt"))
    assert m.lm_head.weight is m.embed.weight
    u = TransformerLM(ModelShape("t", 1, 16, 2, 50, 8, style="llama", tied=False))
    assert u.lm_head.weight is not u.embed.weight


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_padding_never_changes_real_positions(style: str) -> None:
    shape = ModelShape("t", 2, 32, 4, 40, 16, kv_heads=2, style=style, tied=style == "gpt")
    m = TransformerLM(shape, dtype=torch.float64)
    ids = torch.tensor([[5, 6, 7, 8, 9, 0, 0, 0]])
    other = torch.tensor([[5, 6, 7, 8, 9, 33, 21, 4]])  # different content in the padding
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    a, b = m(ids, mask), m(other, mask)
    assert_close(a[:, :5], b[:, :5], rtol=1e-12, atol=1e-12)
    # and causal: a later token never changes an earlier position
    c = m(torch.tensor([[5, 6, 7, 8, 10, 0, 0, 0]]), mask)
    assert_close(a[:, :4], c[:, :4], rtol=1e-12, atol=1e-12)


def test_rope_preserves_norms_and_is_relative() -> None:
    cos, sin = rope_tables(10, 8, torch.float64)
    x = torch.randn(1, 1, 10, 8, dtype=torch.float64)
    y = apply_rope(x, cos, sin)
    assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    qs = apply_rope(q.expand(1, 1, 10, 8), cos, sin)[0, 0]
    ks = apply_rope(k.expand(1, 1, 10, 8), cos, sin)[0, 0]
    # <q_i, k_j> depends only on i - j.
    assert_close(qs[3] @ ks[1], qs[7] @ ks[5], rtol=1e-10, atol=1e-12)


MOE_SHAPES = [
    ModelShape("m", 2, 16, 2, 50, 8, style="llama", tied=False, moe=MoE(4, 2, 8)),
    ModelShape("m", 3, 16, 4, 50, 8, kv_heads=2, style="llama",
               moe=MoE(8, 2, 4, shared_experts=2, shared_d_ff=6, dense_layers=1)),
    ModelShape("m", 2, 16, 2, 50, 8, style="llama", qkv_bias=True,
               moe=MoE(4, 1, 8, router_bias=True, dense_layers=2)),  # all layers dense
    ModelShape("m", 2, 16, 2, 50, 8, style="gpt", moe=MoE(4, 2, 8, router_bias=True)),
    ModelShape("m", 3, 16, 2, 50, 8, style="gpt",
               moe=MoE(4, 2, 8, shared_experts=3, shared_d_ff=12, dense_layers=1)),
]


@pytest.mark.parametrize("shape", MOE_SHAPES, ids=range(len(MOE_SHAPES)))
def test_moe_numel_equals_cost_model(shape: ModelShape) -> None:
    model = TransformerLM(shape)
    assert numel(model) == count_params(shape).total
    assert shape.moe is not None
    kinds = [type(b.mlp) for b in model.blocks]
    assert kinds == [MLP] * shape.moe.dense_layers + [MoEFeedForward] * shape.moe_layers


def test_moe_init_is_gpt2s_and_seed_deterministic() -> None:
    shape = MOE_SHAPES[3]
    a, b = TransformerLM(shape, seed=3), TransformerLM(shape, seed=3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    moe = a.blocks[0].mlp
    assert isinstance(moe, MoEFeedForward) and isinstance(moe.experts, GroupedExperts)
    assert moe.experts.b_up is not None and moe.experts.b_down is not None
    assert not moe.experts.b_up.any() and not moe.experts.b_down.any()
    for w in (moe.experts.w_up, moe.experts.w_down, moe.router.weight):
        assert abs(w.std().item() - 0.02) < 0.004
    ids = torch.randint(0, 50, (2, 8))
    assert a(ids).shape == (2, 8, 50)
