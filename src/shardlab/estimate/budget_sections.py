"""The parallel layouts' own sections of a budget: the mixture-of-experts section (expert
layout, routed tokens, capacity, all-to-all) and the context-parallel one (zigzag chunks,
K/V collectives), with the calls and seconds of their collectives per step
(:func:`shardlab.estimate.budget.model_budget` puts them in its document)."""

from __future__ import annotations

from typing import Any

from shardlab.config.layout import Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.context import (
    causal_imbalance,
    chunk_tokens,
    cp_attention_flops,
    cp_bytes_per_step,
    cp_passes,
    gathered_kv_bytes,
    kv_gather_bytes,
    kv_grad_bytes,
    zigzag_chunks,
)
from shardlab.estimate.expert import (
    alltoall_passes,
    expert_alltoall_bytes,
    expert_capacity,
    layout_moe_layers,
    layout_tokens,
    routed_activation_bytes,
    routed_rows,
)
from shardlab.estimate.partition import layout_rank_layers


def alltoall_calls(m: ModelShape, lay: Layout) -> int:
    """All-to-alls one rank runs per step: 2 per MoE layer and micro-batch, forward and
    backward (and forward again under full recompute), on the busiest stage."""
    if lay.ep == 1:
        return 0
    layers = max(layout_moe_layers(m, lay))
    return 2 * alltoall_passes(lay.recompute) * lay.microbatches * layers


def cp_calls(m: ModelShape, lay: Layout) -> int:
    """K/V collectives one rank of the busiest stage runs per step: per layer and
    micro-batch the forward all-gathers (twice under full recompute) and the backward
    reduce-scatter."""
    if lay.cp == 1:
        return 0
    return (cp_passes(lay.recompute) + 1) * lay.microbatches * max(layout_rank_layers(m, lay))


def cp_seconds(m: ModelShape, lay: Layout, link: Any) -> float:
    """Alpha-beta seconds of a step's K/V collectives on the cp group's link: each call
    (cp-1)·α, and the bytes of :func:`~shardlab.estimate.context.cp_bytes_per_step` at the
    link's bandwidth (all on the critical path: attention waits for its keys)."""
    calls = cp_calls(m, lay)
    if not calls:
        return 0.0
    return calls * (lay.cp - 1) * link.latency + cp_bytes_per_step(m, lay) / link.bandwidth


def cp_section(m: ModelShape, lay: Layout, link: str) -> dict[str, Any] | None:
    """The ``cp`` section (:mod:`shardlab.estimate.context`); None without context
    parallelism."""
    if lay.cp == 1:
        return None
    return {
        "cp": lay.cp, "chunks": 2 * lay.cp, "chunk_tokens": chunk_tokens(lay.seq, lay.cp),
        "tokens_per_rank": lay.seq // lay.cp, "rank0_chunks": list(zigzag_chunks(lay.cp, 0)),
        "kv_gather_bytes_per_layer": kv_gather_bytes(m, lay),
        "kv_grad_bytes_per_layer": kv_grad_bytes(m, lay),
        "gathers_per_layer": cp_passes(lay.recompute),
        "gathered_kv_bytes_per_layer": (0 if lay.recompute == "full"
                                        else gathered_kv_bytes(m, lay)),
        "bytes_per_step": cp_bytes_per_step(m, lay), "calls_per_step": cp_calls(m, lay),
        "link": link,
        "causal_imbalance": causal_imbalance(lay.seq, lay.cp),
        "causal_imbalance_contiguous": causal_imbalance(lay.seq, lay.cp, zigzag=False),
        "attention_flops_per_layer_rank0": cp_attention_flops(m, lay),
        "not_divided": "the K and V gathered from the other cp ranks (kept for backward); "
        "model states (divided only by ZeRO's shard group, dp_shard x cp)",
    }


def moe_section(m: ModelShape, lay: Layout, imbalance: float = 1.0) -> dict[str, Any] | None:
    """The ``moe`` section: expert layout, routed tokens, capacity, activations, all-to-all
    (:mod:`shardlab.estimate.expert`); None for a dense model."""
    if m.moe is None:
        return None
    e = m.moe
    tokens = layout_tokens(lay)
    bp = lay.dtype.activation_bytes
    return {
        "experts": e.experts, "top_k": e.experts_per_token,
        "shared_experts": e.shared_experts, "moe_layers": m.moe_layers,
        "ep": lay.ep, "etp": lay.etp, "expert_dp": lay.expert_dp,
        "experts_per_rank": e.experts // lay.ep,
        "capacity_factor": lay.capacity_factor,
        "capacity_per_expert": expert_capacity(m, tokens, lay.capacity_factor),
        "routing_imbalance": imbalance,
        "routed_tokens_per_microbatch": tokens,
        "routed_rows_per_microbatch": routed_rows(m, tokens, lay.ep, lay.capacity_factor,
                                                  imbalance),
        "routed_activation_bytes_per_layer": (0.0 if lay.recompute == "full" else
                                              routed_activation_bytes(
            m, tokens, bp, ep=lay.ep, etp=lay.etp, capacity_factor=lay.capacity_factor,
            imbalance=imbalance, input_bytes=lay.dtype.input_bytes,
            combine_bytes=lay.dtype.combine_bytes)),
        "alltoall_bytes_per_step": expert_alltoall_bytes(m, lay),
        "alltoall_calls_per_step": alltoall_calls(m, lay),
    }
