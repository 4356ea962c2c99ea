"""Expert parallelism in the cost model: placement, all-to-all bytes, routed activations."""

from __future__ import annotations

import math

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.layout import make_layout
from shardlab.config.model import ModelShape, MoE
from shardlab.estimate.expert import (
    alltoall_send_bytes,
    dispatch_rows,
    expert_alltoall_bytes,
    expert_capacity,
    layer_alltoall_bytes,
    moe_flops_per_token,
    rank_params_split,
    rank_state_bytes,
    routed_activation_bytes,
    routed_rows,
    routed_tokens,
)
from shardlab.estimate.flops import flops_per_token
from shardlab.estimate.params import count_params
from shardlab.estimate.states import zero_state_bytes

TINY = ModelShape("tiny-moe", 4, 64, 4, vocab=128, context=32, style="llama", tied=False,
                  moe=MoE(experts=8, experts_per_token=2, expert_d_ff=96, shared_experts=1,
                          dense_layers=1))


def test_send_bytes_leave_out_the_rows_a_rank_keeps() -> None:
    assert alltoall_send_bytes([3, 5, 7], 1, 10) == (3 + 7) * 10
    assert alltoall_send_bytes([4], 0, 8) == 0


def test_dispatch_rows_sum_each_ranks_expert_block_with_capacity() -> None:
    counts = [5, 0, 2, 9, 1, 1, 0, 4]
    assert dispatch_rows(counts, 2) == [16, 6]
    assert dispatch_rows(counts, 4, capacity=3) == [3, 5, 2, 3]


def test_combine_returns_what_dispatch_brought() -> None:
    counts = [[3, 1, 0, 4], [2, 2, 2, 2]]  # 2 ep ranks, 2 experts each
    # rank 0 sends 0+4 to rank 1 and gets back 2+2 it must return: 4 + 4 rows.
    assert layer_alltoall_bytes(counts, 0, 10) == (4 + 4) * 10
    assert layer_alltoall_bytes(counts, 1, 10) == (4 + 4) * 10
    assert layer_alltoall_bytes(counts, 0, 10, capacity=1) == (1 + 2) * 10


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_balanced_bytes_equal_the_count_matrices_of_a_balanced_step(recompute: str) -> None:
    lay = make_layout(TINY, dp=4, ep=4, pp=1, micro_batch=2, seq=16, global_batch=16,
                      recompute=recompute)
    t = routed_tokens(2, 16)
    per_expert = t * 2 // 8
    step = [[[per_expert] * 8] * 4] * (lay.microbatches * TINY.moe_layers)
    exact = expert_alltoall_bytes(TINY, lay, step, ep_rank=2)
    assert exact == expert_alltoall_bytes(TINY, lay)
    # 4 (6) all-to-alls of (ep-1)/ep of T·k rows of d bf16 values per layer and micro-batch.
    passes = 6 if recompute == "full" else 4
    assert exact == passes * 3 / 4 * t * 2 * 64 * 2 * 2 * TINY.moe_layers


def test_the_busiest_rank_sets_the_routed_bytes() -> None:
    lay = make_layout(TINY, dp=4, ep=4, seq=16)
    hot = [[[16, 16, 0, 0, 0, 0, 0, 0]] * 4]  # every token picks experts 0 and 1 (rank 0)
    row = 64 * 2
    # rank 0 keeps its own rows and returns 32 to each of the 3 others; rank 1 sends 32.
    assert expert_alltoall_bytes(TINY, lay, hot, ep_rank=1) == 2 * 32 * row
    assert expert_alltoall_bytes(TINY, lay, hot) == 2 * 3 * 32 * row
    assert expert_alltoall_bytes(TINY, lay, hot + hot) == 2 * 2 * 3 * 32 * row
    assert expert_alltoall_bytes(TINY, make_layout(TINY, dp=2, seq=16)) == 0.0


def test_capacity_is_switch_transformers_ceiling_and_drops_rows() -> None:
    assert expert_capacity(TINY, 32, 0.0) is None
    assert expert_capacity(TINY, 33, 1.0) == math.ceil(33 * 2 / 8)
    lay = make_layout(TINY, dp=4, ep=4, seq=32, capacity_factor=0.5)
    full = make_layout(TINY, dp=4, ep=4, seq=32)
    assert expert_alltoall_bytes(TINY, lay) == pytest.approx(expert_alltoall_bytes(TINY, full) / 2)


def test_routed_rows_take_the_imbalance_up_to_capacity_and_the_tokens() -> None:
    assert routed_rows(TINY, 16) == 32
    assert routed_rows(TINY, 16, ep=2, imbalance=1.5) == 48
    assert routed_rows(TINY, 16, ep=2, capacity_factor=1.25, imbalance=3.0) == 8 * 5
    assert routed_rows(TINY, 16, ep=8, imbalance=100.0) == 8 * 16 * 1  # one expert per rank
    with pytest.raises(ValueError, match="imbalance"):
        routed_rows(TINY, 16, imbalance=0.5)


def test_routed_activations_count_inputs_hidden_outputs_and_router() -> None:
    t, d, f = 16, 64, 96
    want = (t * 2 * d * 2) + (t * 2 * 3 * f * 2) + (t * 2 * d * 2) + 4 * t * 8
    assert routed_activation_bytes(TINY, t, 2) == want
    halved = routed_activation_bytes(TINY, t, 2, etp=2)
    assert halved == want - t * 2 * 3 * f * 2 / 2


def test_mixtral_counts_the_checkpoint_and_splits_experts_over_ep_and_etp() -> None:
    m = get_model("mixtral-8x7b")
    assert count_params(m).total == 46_702_792_704
    lay = make_layout(m, gpus=64, tp=2, ep=8)
    dense, experts = rank_params_split(m, lay)[0]
    assert experts == 32 * 1 * 3 * 4096 * 14336 // 2  # one expert per ep rank, half width
    whole = rank_params_split(m, make_layout(m, gpus=64, tp=2, ep=8, etp=1))[0]
    assert whole == (dense, 2 * experts)
    one = rank_params_split(m, make_layout(m, gpus=64, tp=2))[0]
    assert one[0] == dense and one[1] == 8 * experts


@pytest.mark.parametrize(("ep", "etp", "zero"), [(1, 2, 3), (4, 2, 1), (8, 1, 3), (2, 1, 0)])
def test_expert_state_is_sharded_over_expert_dp_and_the_rest_over_dp(
        ep: int, etp: int, zero: int) -> None:
    m = get_model("mixtral-8x7b")
    lay = make_layout(m, gpus=64, tp=2, pp=2, ep=ep, etp=etp, zero=zero)
    for (dense, experts), got in zip(rank_params_split(m, lay), rank_state_bytes(m, lay),
                                     strict=True):
        want = zero_state_bytes(dense, lay.dtype, zero, 16).total + zero_state_bytes(
            experts, lay.dtype, zero, 16 // ep).total
        assert got.total == pytest.approx(want, rel=1e-12)
    if ep == 1:
        total = sum(d + x for d, x in rank_params_split(m, lay))
        assert rank_state_bytes(m, lay)[0].total == pytest.approx(
            zero_state_bytes(total / 2, lay.dtype, zero, 16).total, rel=0.01)


def test_moe_flops_are_the_active_parts_of_flops_per_token() -> None:
    parts = moe_flops_per_token(TINY)
    d = 64
    assert parts["router"] == 2 * 3 * d * 8
    assert parts["routed"] == 2 * 3 * 3 * d * 2 * 96
    assert parts["shared"] == 2 * 3 * 3 * d * 96
    dense_twin = ModelShape("twin", 4, 64, 4, vocab=128, context=32, style="llama",
                            tied=False, d_ff=256)
    # layer 0 dense (d_ff 256), 3 MoE layers: the per-token forward adds up part by part.
    attn_etc = flops_per_token(dense_twin, 16).forward - 2 * 4 * 3 * d * 256
    assert flops_per_token(TINY, 16).forward == pytest.approx(
        attn_etc + 2 * 3 * d * 256 + sum(parts.values()))


def test_fp8_experts_keep_their_matmul_inputs_in_one_byte() -> None:
    # Transformer Engine's GroupedLinear saves the fp8 copies of both expert matmul inputs
    # (the dispatched rows, the down projection's input); gate and up outputs stay bf16.
    t = 32
    rows = t * 2  # top-2, dropless: every assignment kept
    bf16 = routed_activation_bytes(TINY, t, 2)
    fp8 = routed_activation_bytes(TINY, t, 2, input_bytes=1)
    assert bf16 - fp8 == rows * 64 + rows * 96


def test_the_combine_keeps_what_the_framework_multiplies() -> None:
    # Megatron-Core (core_v0.13+) multiplies the gates inside the experts' activation and
    # keeps no combined outputs; torchtitan keeps an fp32 upcast (4 B); default e.
    t = 32
    own = t * 2  # the rank's kept assignments, top-2 dropless
    plain = routed_activation_bytes(TINY, t, 2)
    assert plain - routed_activation_bytes(TINY, t, 2, combine_bytes=0) == own * 64 * 2
    assert routed_activation_bytes(TINY, t, 2, combine_bytes=4) - plain == own * 64 * 2
