"""Communication: ring volumes, ZeRO's 2Ψ vs 3Ψ, Megatron TP and PP message counts."""

import pytest
from torch.testing import assert_close

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import LINKS
from shardlab.config.layout import make_layout
from shardlab.estimate.comm import (
    dp_bytes_per_step,
    embedding_sync_bytes,
    pp_bytes_per_rank,
    pp_messages_per_rank,
    ring_allreduce_bytes,
    ring_allreduce_seconds,
    ring_gather_bytes,
    tp_bytes_per_stage,
)


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
