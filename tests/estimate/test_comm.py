"""Communication: ring volumes (the mean, and each rank's exact bytes on the ring's integer
chunks), ZeRO's 2Ψ vs 3Ψ, FSDP2's padding, Megatron TP and PP message counts."""

import pytest
from torch.testing import assert_close

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import LINKS
from shardlab.config.layout import make_layout
from shardlab.config.model import ModelShape
from shardlab.estimate.comm import (
    dp_bytes_per_step,
    embedding_sync_bytes,
    fsdp2_padded_params,
    pp_bytes_per_rank,
    pp_messages_per_rank,
    ring_all_gather_sent,
    ring_allreduce_bytes,
    ring_allreduce_seconds,
    ring_allreduce_sent,
    ring_chunks,
    ring_gather_bytes,
    ring_reduce_scatter_sent,
    tp_bytes_per_stage,
)
from shardlab.estimate.partition import stage_params


def test_ring_volumes() -> None:
    assert ring_allreduce_bytes(1000, 4) == 1500
    assert ring_gather_bytes(1000, 4) == 750
    assert ring_allreduce_bytes(1000, 1) == 0


def test_ring_allreduce_time_alpha_beta() -> None:
    link = LINKS["IB NDR 400G"]
    t = ring_allreduce_seconds(1e9, 8, link)
    assert_close(t, 14 * link.latency + 2 * 7 / 8 * 1e9 / link.bandwidth, rtol=1e-12, atol=0)


def test_zero_volumes_2psi_and_3psi() -> None:
    bf16, psi, n = get_policy("bf16"), 1e9, 1024
    frac = (n - 1) / n
    assert_close(dp_bytes_per_step(psi, bf16, 0, n), 2 * psi * 2 * frac, rtol=1e-12, atol=0)
    for z in (1, 2):
        assert_close(dp_bytes_per_step(psi, bf16, z, n), 2 * psi * 2 * frac, rtol=1e-12, atol=0)
    assert_close(dp_bytes_per_step(psi, bf16, 3, n), 3 * psi * 2 * frac, rtol=1e-12, atol=0)
    # FSDP gathers weights again for every micro-batch.
    assert_close(dp_bytes_per_step(psi, bf16, 3, n, 4), (8 + 1) * psi * 2 * frac,
                 rtol=1e-12, atol=0)


def test_tp_four_allreduces_per_layer() -> None:
    m = get_model("llama-3-8b")
    lay = make_layout(m, tp=8, global_batch=2)
    act = 1 * 8192 * 4096 * 2
    ar = 2 * 7 / 8 * act
    # 2 micro-batches x (4 per layer x 32 layers + embedding output + head input gradient)
    (got,) = tp_bytes_per_stage(m, lay)
    assert_close(got, 2 * (4 * 32 + 2) * ar, rtol=1e-12, atol=0)
    assert tp_bytes_per_stage(m, lay, vocab_parallel=False) == [2 * 4 * 32 * ar]
    full = make_layout(m, tp=8, global_batch=2, recompute="full")
    assert tp_bytes_per_stage(m, full)[0] > got
    # Sequence parallel: same activation bytes, plus the norms' gradient all-reduce.
    sp = make_layout(m, tp=8, global_batch=2, sp=True)
    norms = 32 * 2 * 4096 * 2
    assert_close(tp_bytes_per_stage(m, sp)[0], got + 2 * 7 / 8 * norms, rtol=1e-12, atol=0)


def test_tp_per_stage_with_pipeline() -> None:
    m = get_model("llama-3-8b")
    lay = make_layout(m, tp=2, pp=4, global_batch=4)
    act = 8192 * 4096 * 2
    per_layer = 4 * 8 * 4 * (act / 2 * 2)  # 4 micro-batches x 8 layers x 4 all-reduces
    first, mid, _, last = tp_bytes_per_stage(m, lay)
    assert mid == per_layer and first == last == per_layer + 4 * act


@pytest.mark.parametrize(("pp", "v", "want"), [
    (1, 1, [0]), (2, 1, [1, 1]), (4, 1, [1, 2, 2, 1]), (4, 2, [3, 4, 4, 3]),
])
def test_pp_messages(pp: int, v: int, want: list[int]) -> None:
    assert pp_messages_per_rank(pp, v) == want


def test_pp_bytes_scale_with_microbatches() -> None:
    m = get_model("llama-3-8b")
    a = make_layout(m, pp=4, global_batch=4)
    b = make_layout(m, pp=4, global_batch=8)
    act = 8192 * 4096 * 2
    assert pp_bytes_per_rank(m, a) == [4 * act, 8 * act, 8 * act, 4 * act]
    assert max(pp_bytes_per_rank(m, b)) == 2 * max(pp_bytes_per_rank(m, a))
    tp = make_layout(m, tp=2, pp=4, global_batch=4)
    assert pp_bytes_per_rank(m, tp) == [x / 2 for x in pp_bytes_per_rank(m, a)]
    assert pp_bytes_per_rank(m, tp, split_by_tp=False) == pp_bytes_per_rank(m, a)


def test_tied_embedding_sync_only_across_stages() -> None:
    g = get_model("gpt2")
    assert embedding_sync_bytes(g, make_layout(g)) == 0
    two = make_layout(g, pp=2, global_batch=2)
    assert embedding_sync_bytes(g, two) == 50257 * 768 * 2
    assert embedding_sync_bytes(get_model("llama-3-8b"), make_layout(get_model("llama-3-8b"),
                                                                      pp=2)) == 0


# ---------------------------------------------------------------------------
# Exact bytes per rank on the ring's integer chunks
# ---------------------------------------------------------------------------


def test_ring_chunks_are_tensor_splits() -> None:
    torch = pytest.importorskip("torch")
    for n in range(13):
        for p in range(1, 7):
            want = [len(c) for c in torch.tensor_split(torch.arange(n), p)]
            assert ring_chunks(n, p) == want, (n, p)


def test_exact_ring_bytes_by_hand() -> None:
    # 10 elements over 4 ranks: chunks 3, 3, 2, 2.
    assert ring_chunks(10, 4) == [3, 3, 2, 2]
    # All-reduce: every chunk but (r+1) mod p, then every chunk but (r+2) mod p.
    assert [ring_allreduce_sent(10, 4, r) for r in range(4)] == [15, 16, 15, 14]
    # Reduce-scatter: every chunk but its own; all-gather: every chunk but (r+1) mod p.
    assert [ring_reduce_scatter_sent(10, 4, r, 8) for r in range(4)] == [56, 56, 64, 64]
    assert [ring_all_gather_sent(10, 4, r, 8) for r in range(4)] == [56, 64, 64, 56]
    assert ring_allreduce_sent(10, 1, 0) == ring_all_gather_sent(10, 1, 0) == 0
    with pytest.raises(ValueError, match="rank=4"):
        ring_allreduce_sent(10, 4, 4)


@pytest.mark.parametrize("p", [2, 3, 5, 6, 7])
@pytest.mark.parametrize("n", [0, 1, 5, 29, 30, 1001])
def test_exact_ring_bytes_average_to_the_mean(n: int, p: int) -> None:
    """Over the ranks the exact figures sum to (p-1)·n per pass: their mean is the cost model's
    (p-1)/p·n, and every rank's figure is that when p divides n."""
    ar = [ring_allreduce_sent(n, p, r, 4) for r in range(p)]
    rs = [ring_reduce_scatter_sent(n, p, r, 4) for r in range(p)]
    ag = [ring_all_gather_sent(n, p, r, 4) for r in range(p)]
    assert sum(ar) == 2 * (p - 1) * n * 4 and sum(rs) == sum(ag) == (p - 1) * n * 4
    assert_close(sum(ar) / p, ring_allreduce_bytes(4 * n, p), rtol=1e-12, atol=0)
    assert_close(sum(ag) / p, ring_gather_bytes(4 * n, p), rtol=1e-12, atol=0)
    assert max(ar) - min(ar) <= 2 * 4 and max(rs) - min(rs) <= 4 and max(ag) - min(ag) <= 4
    if n % p == 0:
        assert set(ar) == {ring_allreduce_bytes(4 * n, p)}
        assert set(rs) == set(ag) == {ring_gather_bytes(4 * n, p)}


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("dp", [3, 5, 6])
def test_dp_bytes_per_rank_exact_and_their_mean(dp: int, zero: int) -> None:
    fp32, psi = get_policy("fp32"), 7216  # 7216 mod 3, 5, 6 = 1, 1, 4
    each = [dp_bytes_per_step(psi, fp32, zero, dp, 2, rank=r) for r in range(dp)]
    assert all(isinstance(x, int) for x in each) and len(set(each)) > 1
    assert_close(sum(each) / dp, dp_bytes_per_step(psi, fp32, zero, dp, 2), rtol=1e-12, atol=0)
    if zero == 0:
        assert each == [ring_allreduce_sent(psi, dp, r, 4) for r in range(dp)]
    else:
        gathers = 4 if zero == 3 else 1
        assert each == [ring_reduce_scatter_sent(psi, dp, r, 4)
                        + gathers * ring_all_gather_sent(psi, dp, r, 4) for r in range(dp)]
    with pytest.raises(ValueError, match="whole number"):
        dp_bytes_per_step(psi + 0.5, fp32, zero, dp, rank=0)


def test_tp_bytes_per_rank_exact_and_their_mean() -> None:
    # head_dim given: d = 32 with 3 heads of 8, so tp = 3 divides neither b·s·d (2 x 31 x 32)
    # nor the 2 x 2 x 32 norm weights sequence parallelism all-reduces.
    m = ModelShape("odd", 2, 32, 3, 156, 33, head_dim=8, d_ff=48, style="llama", tied=False)
    for kw in ({}, {"sp": True, "seq": 33}, {"pp": 2, "recompute": "full"}):
        lay = make_layout(m, tp=3, global_batch=4, micro_batch=2, seq=kw.pop("seq", 31), **kw)
        for vocab_parallel in (True, False):
            mean = tp_bytes_per_stage(m, lay, vocab_parallel)
            each = [tp_bytes_per_stage(m, lay, vocab_parallel, rank=t) for t in range(3)]
            for s in range(lay.pp):
                assert_close(sum(e[s] for e in each) / 3, mean[s], rtol=1e-12, atol=0)
                assert len({e[s] for e in each}) > 1, (kw, vocab_parallel)


# ---------------------------------------------------------------------------
# FSDP2: every parameter's dim 0 padded to a multiple of dp
# ---------------------------------------------------------------------------


def test_fsdp2_padding_is_torch_chunks_of_the_real_tensors() -> None:
    torch = pytest.importorskip("torch")
    from shardlab.nn.model import TransformerLM
    from shardlab.sim.shard import shard

    shapes = [ModelShape("llama", 2, 48, 6, 157, 16, kv_heads=2, d_ff=100, style="llama",
                         tied=False, qkv_bias=True),
              ModelShape("gpt", 2, 48, 6, 157, 17, d_ff=100, style="gpt", tied=True)]
    for m in shapes:
        model = TransformerLM(m, dtype=torch.float32)
        for tp in (1, 2):
            # The tensor-parallel shards (Megatron's split, as torch's plan makes them), the
            # vocabulary whole, padded as FSDP2 pads them: dp x the first torch.chunk.
            local = [shard(n, p.detach(), 0, tp) for n, p in model.named_parameters()]
            for dp in (1, 2, 3, 5):
                want = sum(dp * x.chunk(dp)[0].numel() if x.dim() else x.numel()
                           for x in local)
                got = fsdp2_padded_params(m, tp, 1, dp, vocab_parallel=False)
                assert got == [want], (m.name, tp, dp)
                # Each rank's own torch.chunk (the last ranks' shorter, or empty).
                for r in range(dp):
                    own = sum(x.chunk(dp)[r].numel() if r < len(x.chunk(dp)) else 0
                              for x in local)
                    assert fsdp2_padded_params(m, tp, 1, dp, vocab_parallel=False,
                                               position=r) == [own], (m.name, tp, dp, r)
                if dp == 1:
                    assert got == stage_params(m, tp, 1, vocab_parallel=False)


def test_fsdp2_padding_of_the_default_train_model_and_pipelines() -> None:
    # shardlab train's default model at dp = 3: every rank reduce-scattered 1,151,304 bytes
    # (4 x 287,826) per step in a real run (fp32, gloo, torch 2.13).
    m = ModelShape("llama", 4, 64, 4, 156, 32, d_ff=256, style="llama", tied=False)
    assert stage_params(m, 1, 1) == [282_688]
    assert fsdp2_padded_params(m, 1, 1, 3) == [287_826]
    g = get_model("gpt2")
    for pp, v in ((2, 1), (4, 2)):
        for dp in (1, 8):
            padded = fsdp2_padded_params(g, 2, pp, dp, v)
            exact = stage_params(g, 2, pp, v)
            assert all(a >= b for a, b in zip(padded, exact, strict=True))
            assert (padded == exact) == (dp == 1)
