"""What FSDP keeps gathered inside shardlab's pipeline: counted by hand, zero where it does
not apply, and in the memory guard's figure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.model import ModelShape, MoE
from shardlab.estimate.partition import layer_params_per_tp_rank, stage_params
from shardlab.train.config import TrainConfig
from shardlab.train.report import predicted_peak_bytes
from shardlab.train.report_fsdp import pipeline_fsdp_bytes, whole_embedding_grad_bytes

LLAMA3_8B = get_model("llama-3-8b")
PIPE = TrainConfig(LLAMA3_8B, dp=4, pp=2, global_batch=8, micro_batch=1, seq=2048,
                   recompute="full", dtype="bf16")


def test_a_stage_holds_its_blocks_gathered_and_every_gradient_unsharded_in_fp32() -> None:
    # Stage 0 of llama-3-8b over pp 2: 16 blocks of 218,112,000 parameters in bf16, and all
    # of its 4,015,128,576 parameters' gradients in fp32 (the dry run measured 6.98 GB and
    # 16.09 GB, `shardlab dryrun ... "dp=4 pp=2 zero=3 micro_batch=1 recompute=full"`).
    block = layer_params_per_tp_rank(LLAMA3_8B, 1, moe_layer=False)
    psi = stage_params(LLAMA3_8B, 1, 2)
    assert block == 218_112_000 and psi[0] == 4_015_128_576
    assert pipeline_fsdp_bytes(PIPE, 0) == 16 * block * 2 + psi[0] * 4
    assert pipeline_fsdp_bytes(replace(PIPE, dtype="fp32"), 0) == 16 * block * 4 + psi[0] * 4


def test_the_first_stage_accumulates_the_vocabulary_parallel_embedding_gradient_whole() -> None:
    # DTensor's embedding backward has no row-wise strategy: under tp the embedding's
    # gradient is the whole [vocab, d_model] on every tp rank, accumulated in fp32 (the
    # dry run: 147.9 MB where the shards are 80.8 MB, report_fsdp's docstring).
    tp = replace(PIPE, tp=2, dp=2)
    block = layer_params_per_tp_rank(LLAMA3_8B, 2, moe_layer=False)
    psi = stage_params(LLAMA3_8B, 2, 2)
    whole = LLAMA3_8B.vocab * LLAMA3_8B.d_model
    assert pipeline_fsdp_bytes(tp, 0) == 16 * block * 2 + (psi[0] + whole // 2) * 4
    assert whole_embedding_grad_bytes(tp, 0) == whole // 2 * 4
    # Not on the last stage, and not without tp (the shard is the whole vocabulary).
    assert whole_embedding_grad_bytes(tp, 1) == 0.0
    assert whole_embedding_grad_bytes(PIPE, 0) == 0.0
    assert pipeline_fsdp_bytes(tp, 1) == 16 * block * 2 + psi[1] * 4


@pytest.mark.parametrize("change", [
    {"pp": 1, "dp": 8},  # no pipeline: FSDP reshards and syncs every step as usual
    {"dp_mode": "ddp", "dp": 1, "tp": 4},  # no FSDP
    {"dp": 1, "tp": 4},  # a shard group of one
    {"micro_batch": 2},  # one micro-batch per step: nothing accumulates
])
def test_nothing_is_held_where_it_does_not_apply(change: dict) -> None:
    assert pipeline_fsdp_bytes(replace(PIPE, **change), 0) == 0.0


def test_a_mixture_of_experts_holds_its_own_experts_gathered() -> None:
    """A MoE stage holds its blocks gathered with the rank's own experts (E/ep) at the
    compute dtype, and every parameter it holds (dense and its experts) as an fp32
    gradient: Mixtral 8x7B's dry run over dp=8 pp=8 ep=8 read 4.22 GB of such gradients
    (report_fsdp's docstring) where this term was 0."""
    moe = ModelShape("m", 4, 256, 4, vocab=512, context=64, style="llama", tied=False,
                     d_ff=512, moe=MoE(experts=4, experts_per_token=2, expert_d_ff=256))
    for ep in (1, 2):
        cfg = replace(PIPE, shape=moe, seq=64, ep=ep)
        layer = layer_params_per_tp_rank(moe, 1, True, ep, 1)
        experts = 2 * 4 // ep * 3 * 256 * 256  # stage 0's 2 layers, E/ep experts each
        dense = stage_params(moe, 1, 2)[0] - 2 * 4 * 3 * 256 * 256
        assert pipeline_fsdp_bytes(cfg, 0) == 2 * layer * 2 + (dense + experts) * 4, ep


def test_the_memory_guard_counts_it() -> None:
    with_pipe = predicted_peak_bytes(PIPE)
    assert with_pipe >= pipeline_fsdp_bytes(PIPE, 0) > 20e9
