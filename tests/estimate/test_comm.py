"""Communication: ring volumes, ZeRO's 2Ψ vs 3Ψ, Megatron TP and PP message counts."""

import pytest
from torch.testing import assert_close

from shardlab.estimate.comm import (
    dp_bytes_per_step,
    pp_bytes_per_step,
    pp_messages_per_rank,
    ring_allreduce_bytes,
    ring_allreduce_seconds,
    ring_gather_bytes,
    tp_bytes_per_step,
)
from shardlab.spec.catalog import get_model
from shardlab.spec.dtypes import get_policy
from shardlab.spec.hardware import LINKS
from shardlab.spec.layout import make_layout


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
    want = 2 * (4 * 32 + 1) * 2 * 7 / 8 * act
    assert_close(tp_bytes_per_step(m, lay, 32), want, rtol=1e-12, atol=0)
    full = make_layout(m, tp=8, global_batch=2, recompute="full")
    assert tp_bytes_per_step(m, full, 32) > tp_bytes_per_step(m, lay, 32)
    sp = make_layout(m, tp=8, global_batch=2, sp=True)
    assert tp_bytes_per_step(m, sp, 32) == tp_bytes_per_step(m, lay, 32)


@pytest.mark.parametrize(("pp", "v", "want"), [
    (1, 1, [0]), (2, 1, [1, 1]), (4, 1, [1, 2, 2, 1]), (4, 2, [3, 4, 4, 3]),
])
def test_pp_messages(pp: int, v: int, want: list[int]) -> None:
    assert pp_messages_per_rank(pp, v) == want


def test_pp_bytes_scale_with_microbatches() -> None:
    m = get_model("llama-3-8b")
    a = make_layout(m, pp=4, global_batch=4)
    b = make_layout(m, pp=4, global_batch=8)
    assert pp_bytes_per_step(m, b) == 2 * pp_bytes_per_step(m, a) == 2 * 2 * 4 * 8192 * 4096 * 2
