"""The budget with context parallelism, HSDP and uneven stages: figures derived by hand,
and the same bytes as the context module's exact per-rank formulas."""

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.config.layout import make_layout
from shardlab.estimate.budget import Assumptions, model_budget
from shardlab.estimate.comm import layout_dp_bytes
from shardlab.estimate.context import cp_bytes_per_step, grad_sync_bytes
from shardlab.estimate.expert import rank_params_split
from shardlab.estimate.params import count_params
from shardlab.plan.choices import fewer_at_ends

H100 = get_accelerator("h100")
LLAMA3_8B = get_model("llama-3-8b")


def test_llama3_8b_at_131072_on_64_h100_with_cp8_activations_by_hand() -> None:
    """The issue's case: Llama 3 8B, sequence 131,072, 64 H100, cp = 8 (dp 8, bf16, flash
    attention, no recompute, micro-batch 1, llama: no dropout masks)."""
    doc = model_budget(LLAMA3_8B, make_layout(LLAMA3_8B, gpus=64, cp=8, seq=131072), H100)
    assert (doc["layout"]["dp"], doc["layout"]["cp"]) == (8, 8)
    s, cp, e = 131_072, 8, 2
    tokens = s // cp                                  # 16,384 tokens on each cp rank
    h, q, kv, f, heads, vocab, layers = 4096, 4096, 1024, 14336, 32, 128_256, 32
    inputs = 4 * tokens * h * e                       # two norms', QKV's and the MLP's inputs
    inside = tokens * e * (2 * q + 2 * kv + 3 * f)    # Q, K, V, out-proj input, SwiGLU's three
    softmax_stats = 4 * heads * tokens                # fp32 per query and head (flash)
    gathered_kv = (s - tokens) * 2 * kv * e           # the other 7 ranks' K and V: not / cp
    per_layer = inputs + inside + softmax_stats + gathered_kv
    assert per_layer == 536_870_912 + 1_744_830_464 + 2_097_152 + 469_762_048
    head_inputs = 2 * tokens * h * e                  # final norm's and head's inputs
    logits = 4 * tokens * vocab                       # fp32 logits of the rank's tokens
    activations = layers * per_layer + head_inputs + logits  # one micro-batch in flight
    assert activations == 96_787_759_104
    assert doc["memory"]["activations_per_layer"] == per_layer
    assert doc["memory"]["per_device"]["activations"] == activations
    # Without cp the same rank would keep 8x the per-token terms and no gathered K/V.
    one = model_budget(LLAMA3_8B, make_layout(LLAMA3_8B, gpus=8, seq=131072), H100)
    assert one["memory"]["activations_per_layer"] == 8 * (per_layer - gathered_kv)
    # Attention FLOPs per token do not change with cp; the zigzag balances causal work.
    assert doc["flops"]["train_per_token"] == one["flops"]["train_per_token"]
    assert doc["cp"]["causal_imbalance"] == 1.0
    assert doc["cp"]["causal_imbalance_contiguous"] == pytest.approx(15 / 8, rel=1e-4)


def test_cp_bytes_are_their_own_kind_on_the_cp_group_link() -> None:
    lay = make_layout(LLAMA3_8B, gpus=64, cp=8, seq=131072, zero=3)
    doc = model_budget(LLAMA3_8B, lay, H100)
    c = doc["comm"]
    # Forward all-gather + backward reduce-scatter: 2 x 7 x 16,384 x 2,048 x 2 bytes x 32.
    assert c["cp_bytes_per_step"] == cp_bytes_per_step(LLAMA3_8B, lay) == 2 * 7 * 16384 * 2048 \
        * 2 * 32
    assert c["cp_link"] == "NVLink 4" and c["tp_bytes_per_step"] == 0
    assert doc["cp"]["bytes_per_step"] == c["cp_bytes_per_step"] and doc["cp"]["link"]
    wide = model_budget(LLAMA3_8B, make_layout(LLAMA3_8B, gpus=64, cp=4, tp=4,
                                               seq=131072), H100)
    assert wide["comm"]["cp_link"] == H100.inter_link.name  # cp x tp = 16 spans two nodes
    # ZeRO-3 shards over dp x cp = 64 ranks (torchtitan's dp_shard_cp).
    params = count_params(LLAMA3_8B).total
    assert doc["memory"]["per_device"]["weights"] == pytest.approx(2 * params / 64)
    assert doc["memory"]["zero_shard_group"] == 64
    assert model_budget(LLAMA3_8B, make_layout(LLAMA3_8B, gpus=8, seq=8192), H100)["cp"] is None


def test_hsdp_bytes_inside_and_across_replicas() -> None:
    m = get_model("llama-3-70b")
    lay = make_layout(m, gpus=256, zero=2, dp_replicate=32, global_batch=256, seq=4096)
    doc = model_budget(m, lay, H100)
    dense, experts = max(rank_params_split(m, lay), key=sum)
    g, r = lay.dp_shard, lay.dp_replicate
    inside, across = layout_dp_bytes(dense, experts, lay)
    # Reduce-scatter of bf16 gradients + all-gather of bf16 weights in the 8-rank node,
    # all-reduce of each rank's eighth across the 32 replicas.
    assert inside == pytest.approx((g - 1) / g * dense * (2 + 2))
    assert across == pytest.approx(2 * (r - 1) / r * dense / g * 2)
    assert doc["comm"]["dp_shard_group_bytes_per_step"] == inside
    assert doc["comm"]["dp_replica_bytes_per_step"] == across
    assert doc["comm"]["dp_link"] == "NVLink 4"
    assert doc["comm"]["dp_replica_link"] == H100.inter_link.name
    # The context module's exact bytes of one rank agree (every count divides evenly here).
    n = int(dense) - int(dense) % (g * r)
    assert grad_sync_bytes(n, get_policy("bf16"), lay) == pytest.approx(
        sum(layout_dp_bytes(n, 0, lay)), rel=1e-12)
    # States: over the 8 ranks of a replica, not all 256.
    assert doc["memory"]["per_device"]["optimizer"] == pytest.approx(12 * dense / g)


def test_llama3_405b_with_first_and_last_stage_one_layer_fewer() -> None:
    """Dubey et al. 2024, Sec. 3.3.2: 'we reduce one Transformer layer each from the first
    and the last stages'; 126 layers on 16 stages: 7 + 14 x 8 + 7."""
    m = get_model("llama-3.1-405b")
    split = fewer_at_ends(m.layers, 16, 1)
    assert split == (7, *[8] * 14, 7)
    lay = make_layout(m, gpus=16384, tp=8, pp=16, zero=1, sp=True, global_batch=2048,
                      seq=8192, stage_layers=split)
    doc = model_budget(m, lay, H100, Assumptions())
    stages = doc["memory"]["per_stage"]
    assert [s["layers"] for s in stages] == list(split)
    assert doc["layout"]["stage_layers"] == list(split)
    even = model_budget(m, make_layout(m, gpus=16384, tp=8, pp=16, zero=1, sp=True,
                                       global_batch=2048, seq=8192), H100)
    # Rank 0 keeps the most micro-batches in flight under 1F1B; a layer fewer lowers its peak.
    assert stages[0]["total"] < even["memory"]["per_stage"][0]["total"]
    assert even["memory"]["per_stage"][0]["layers"] == 8
