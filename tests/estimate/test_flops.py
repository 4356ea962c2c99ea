"""FLOPs: the exact count equals the published closed forms where their assumptions hold."""

from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from shardlab.config.catalog import get_model
from shardlab.config.model import ModelShape
from shardlab.estimate.flops import (
    flops_per_token,
    korthikanti_model_flops,
    narayanan_full_recompute_flops,
    train_flops_6nd,
)
from shardlab.estimate.params import count_params

gpt_shapes = st.builds(
    lambda L, a, hd, V, s: ModelShape("h", L, a * hd, a, V, s, style="gpt"),
    st.integers(1, 96), st.integers(1, 128), st.sampled_from([32, 64, 128]),
    st.integers(1000, 260_000), st.integers(128, 32768))


@given(gpt_shapes, st.integers(1, 64))
def test_equals_korthikanti_eq7_and_narayanan(m: ModelShape, batch: int) -> None:
    # Same conventions: matmuls only, full s x s attention, logits counted.
    f = flops_per_token(m, m.context)
    tokens = batch * m.context
    ref = korthikanti_model_flops(batch, m.context, m.layers, m.d_model, m.vocab)
    assert_close(f.train * tokens, ref, rtol=1e-12, atol=0)
    full = flops_per_token(m, m.context, "full").hardware_train * tokens
    assert_close(full, narayanan_full_recompute_flops(batch, m.context, m.layers, m.d_model,
                                                      m.vocab), rtol=1e-12, atol=0)


def test_recompute_adds_hardware_flops_only() -> None:
    m = get_model("llama-3-8b")
    none, sel, full = (flops_per_token(m, 8192, r) for r in ("none", "selective", "full"))
    assert none.train == sel.train == full.train == none.hardware_train
    assert sel.hardware_train == none.train + none.attention
    assert full.hardware_train == none.train + none.forward - none.logits
    assert none.train == 3 * none.forward


def test_causal_halves_attention_only() -> None:
    m = get_model("gpt2")
    full, causal = flops_per_token(m, 1024), flops_per_token(m, 1024, causal=True)
    assert causal.attention * 2 == full.attention
    assert full.forward - causal.forward == full.attention / 2


def test_6nd_is_close_to_exact_for_a_wide_model() -> None:
    # Seed calculator: 6ND drops attention and the embedding/head difference; a few per cent.
    m = get_model("gpt3-175b")
    exact = flops_per_token(m, 2048).train
    approx = train_flops_6nd(count_params(m).total, 1)
    assert 0.95 < approx / exact < 1.0


def test_moe_counts_only_routed_experts() -> None:
    m = get_model("mixtral-8x7b")
    c = count_params(m)
    f = flops_per_token(m, 1)
    # One-token forward: 2 FLOPs per active weight minus norms and embedding (no matmul), plus
    # the 1-key attention core.
    matmul_weights = c.active_per_token - c.norms - c.embedding
    assert f.forward == 2 * matmul_weights + f.attention


@given(st.floats(1, 1e13), st.floats(1, 1e13))
def test_6nd_linear_in_tokens(a: float, b: float) -> None:
    assert_close(train_flops_6nd(7e9, a + b), train_flops_6nd(7e9, a) + train_flops_6nd(7e9, b),
                 rtol=1e-12, atol=0)


def test_flash_recomputes_half_the_attention_core() -> None:
    m = get_model("llama-3-8b")
    f = flops_per_token(m, 8192, flash=True)
    assert f.hardware_train == f.train + f.attention / 2
    # Selective recompute already runs the whole core again: flash adds nothing on top.
    assert flops_per_token(m, 8192, "selective", flash=True).hardware_train == f.train + f.attention


def test_per_operator_checkpointing_runs_every_second_matmul_again() -> None:
    """Llama-3-8B under ``op``: k (4096 x 1024), the output (4096 x 4096) and up (4096 x
    14336) run again in each of 32 layers, 2 FLOPs per weight per token, beside the fused
    kernel's half core."""
    m = get_model("llama-3-8b")
    f = flops_per_token(m, 8192, "op", flash=True)
    again = 2 * 32 * 4096 * (1024 + 4096 + 14336)
    assert f.hardware_train == f.train + f.attention / 2 + again
    assert flops_per_token(m, 8192, "op").hardware_train == f.train + again
