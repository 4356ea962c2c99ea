"""Context parallelism's cost model: placement, K/V bytes, activations, causal balance."""

import dataclasses

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.layout import make_layout
from shardlab.config.model import ModelShape
from shardlab.estimate import context as cx
from shardlab.estimate.activations import layer_activation_bytes
from shardlab.estimate.comm import layout_dp_bytes, ring_all_gather_sent, ring_allreduce_sent
from shardlab.estimate.flops import attention_core_flops_per_token

GQA = ModelShape("gqa", 4, 256, 8, 1000, 4096, kv_heads=2, d_ff=512, style="llama", tied=False)


def test_zigzag_gives_rank_i_chunks_i_and_2cp_minus_1_minus_i() -> None:
    assert cx.rank_positions(8, 2, 0) == [0, 1, 6, 7]
    assert cx.rank_positions(8, 2, 1) == [2, 3, 4, 5]
    assert cx.rank_positions(8, 2, 1, zigzag=False) == [4, 5, 6, 7]
    assert cx.zigzag_chunks(4, 1) == (1, 6)
    for cp in (1, 2, 4):
        held = [p for r in range(cp) for p in cx.rank_positions(48, cp, r)]
        assert sorted(held) == list(range(48)) and held == cx.gathered_positions(48, cp)
    with pytest.raises(ValueError, match="2\\*cp=6"):
        cx.chunk_tokens(32, 3)


def test_kv_bytes_are_gqa_wide_not_query_wide() -> None:
    # Llama-3-8B at 131,072 tokens on cp=8 x tp=8, bf16 (2 bytes): 8 kv heads of 128 over
    # tp=8 is one kv head per rank; each rank holds 16,384 tokens and sends the other 7
    # ranks' worth of its K and V: 7 x 16,384 x 2 x 128 x 2 bytes per layer, each way.
    m = get_model("llama-3-8b")
    lay = make_layout(m, gpus=64, tp=8, cp=8, seq=131_072)
    assert cx.kv_gather_bytes(m, lay) == 7 * 16_384 * 2 * 128 * 2 == 58_720_256
    assert cx.kv_grad_bytes(m, lay) == cx.kv_gather_bytes(m, lay)
    assert cx.cp_bytes_per_step(m, lay) == 32 * 2 * 58_720_256  # 32 layers, forward + back
    mha = dataclasses.replace(m, kv_heads=m.heads)
    assert cx.kv_gather_bytes(mha, make_layout(mha, gpus=64, tp=8, cp=8, seq=131_072)) == \
        4 * cx.kv_gather_bytes(m, lay)  # 32 heads, not 8
    assert cx.kv_gather_bytes(m, make_layout(m, gpus=8, tp=8, seq=131_072)) == 0


def test_bytes_per_stage_follow_uneven_stages_microbatches_and_recompute() -> None:
    lay = make_layout(GQA, dp=1, cp=2, pp=2, stage_layers=(3, 1), global_batch=4, seq=64,
                      dtype="fp32")
    one = 1 * 32 * 2 * 2 * 32 * 4  # (cp-1) x b x s/cp x 2 x kv_heads x head_dim x 4 bytes
    assert cx.kv_gather_bytes(GQA, lay) == one
    assert lay.microbatches == 4
    assert cx.cp_bytes_per_stage(GQA, lay) == [3 * 4 * 2 * one, 1 * 4 * 2 * one]
    full = dataclasses.replace(lay, recompute="full")  # the forward's gather runs twice
    assert cx.cp_bytes_per_stage(GQA, full) == [3 * 4 * 3 * one, 1 * 4 * 3 * one]
    # Per-operator checkpointing keeps no gather's output: it gathers again too.
    assert cx.cp_bytes_per_stage(GQA, lay, "op") == cx.cp_bytes_per_stage(GQA, full)


def test_causal_work_is_balanced_by_the_zigzag_and_not_by_contiguous_chunks() -> None:
    for seq, cp in ((8, 2), (48, 4), (96, 3)):
        # Brute force: query p meets keys 0..p.
        pairs = [sum(p + 1 for p in cx.rank_positions(seq, cp, r)) for r in range(cp)]
        assert pairs == [cx.rank_causal_pairs(seq, cp, r) for r in range(cp)]
        assert len(set(pairs)) == 1 and cx.causal_imbalance(seq, cp) == 1.0
        naive = [cx.rank_causal_pairs(seq, cp, r, zigzag=False) for r in range(cp)]
        assert sum(naive) == sum(pairs) == seq * (seq + 1) // 2
    for cp in (2, 4, 8):  # the naive split's last rank: (2cp-1)/cp of the mean, as s grows
        assert cx.causal_imbalance(1 << 20, cp, zigzag=False) == pytest.approx(
            (2 * cp - 1) / cp, rel=1e-5)


def test_attention_flops_per_rank_sum_to_one_device() -> None:
    lay = make_layout(GQA, dp=1, cp=4, tp=2, micro_batch=3, seq=64)
    ranks = [cx.cp_attention_flops(GQA, lay, r) for r in range(4)]
    assert len(set(ranks)) == 1
    # One device, all tp ranks: 4 x (s(s+1)/2 pairs) x q_dim x b; flops.py's causal
    # convention counts s/2 keys per query instead of (s+1)/2.
    assert 2 * sum(ranks) == 4 * (64 * 65 // 2) * GQA.q_dim * 3
    assert attention_core_flops_per_token(GQA, 64, causal=True) * 64 * 3 / GQA.layers == \
        pytest.approx(2 * sum(ranks) * 64 / 65)


def test_activations_divide_by_cp_but_the_gathered_k_and_v() -> None:
    base = dict(dp=1, tp=2, micro_batch=2, seq=256, dtype="bf16")
    one = make_layout(GQA, **base)
    two = make_layout(GQA, cp=2, **base)
    assert cx.cp_layer_activation_bytes(GQA, one) == layer_activation_bytes(GQA, 2, 256, 2, tp=2)
    # By hand, per term (activations.py's derivation), b = 2, s/cp = 128 tokens per rank,
    # t = 2, e = 2: outside tp 4e + 2 mask bytes per element of sbh; inside tp Q, K, V,
    # attention out and SwiGLU's 3f; the core (2e + 1)·a·s_q·s_k with all 256 keys; and
    # the other rank's K and V, 128 tokens x 2 x 2 heads x 32 / t x e.
    sb, h = 2 * 128, 256
    q, k, f = GQA.q_dim, GQA.kv_dim, GQA.d_ff
    want = (sb * h * (4 * 2 + 2) + sb * 2 * (2 * q + 2 * k + 3 * f) / 2
            + 8 * 128 * 256 * 2 * (2 * 2 + 1) / 2 + 2 * 128 * 2 * k // 2 * 2)
    assert cx.cp_layer_activation_bytes(GQA, two) == want
    full = dataclasses.replace(two, recompute="full")
    assert cx.cp_layer_activation_bytes(GQA, full) == sb * h * 2  # the layer input, s/cp
    assert cx.gathered_kv_bytes(GQA, two) == 2 * 128 * 2 * k // 2 * 2
    assert cx.local_layout(two).seq == 128 and cx.local_layout(two).cp == 1


def test_gradients_sync_over_dp_x_cp_and_hsdp_replicas() -> None:
    lay = make_layout(GQA, dp=2, cp=2, zero=1, global_batch=4, seq=64, dtype="fp32")
    assert cx.grad_group(lay) == cx.shard_group(lay) == 4
    n = 1001  # not a multiple of 4: each position sends its own count
    got = [cx.grad_sync_bytes(n, lay.dtype, lay, pos) for pos in range(4)]
    chunks = [251, 250, 250, 250]
    assert got == [(n - chunks[p]) * 4 + (n - chunks[(p + 1) % 4]) * 4 for p in range(4)]
    hsdp = make_layout(GQA, dp=4, zero=3, dp_replicate=2, global_batch=8, seq=64,
                       dtype="fp32")
    assert cx.shard_group(hsdp) == 2 and hsdp.microbatches == 2
    # Reduce-scatter and 2m = 4 gathers inside a replica of 2, then the rank's 501-element
    # gradient shard all-reduced across the 2 replicas.
    assert cx.grad_sync_bytes(n, hsdp.dtype, hsdp, 0, 1) == (
        (n - 501) * 4 + 4 * (n - 500) * 4 + ring_allreduce_sent(501, 2, 1, 4))
    z0 = make_layout(GQA, dp=2, cp=2, global_batch=4, seq=64, dtype="fp32")
    assert cx.grad_sync_bytes(n, z0.dtype, z0, 3) == ring_allreduce_sent(n, 4, 3, 4)
    assert ring_all_gather_sent(n, 2, 0) == n - 500


@pytest.mark.parametrize("kw", [dict(dp=2, cp=2, zero=1), dict(dp=2, cp=4, zero=0),
                                dict(dp=4, zero=3, dp_replicate=2, global_batch=8),
                                dict(dp=4, cp=2, zero=2, dp_replicate=2)], ids=str)
def test_exact_grad_sync_averages_to_the_budget_s_dp_bytes(kw: dict) -> None:
    # The simulator checks each rank against grad_sync_bytes; budget and plan take the
    # mean (comm.layout_dp_bytes): the two agree when the group divides the buffer.
    lay = make_layout(GQA, seq=64, **kw)
    n, g = 1_200_000, cx.shard_group(lay)
    exact = [cx.grad_sync_bytes(n, lay.dtype, lay, p, r) for r in range(lay.dp_replicate)
             for p in range(g)]
    assert sum(exact) / len(exact) == sum(layout_dp_bytes(n, 0, lay))
