"""Memory per device for a layout: weights, gradients, optimizer state, activations.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, Sec. 5.1), see
:mod:`shardlab.estimate.states`, for the Ψ parameters of each (tensor, pipeline)
rank (:mod:`shardlab.estimate.partition`); a mixture-of-experts rank shards its
routed experts over expert_dp = dp/ep and the rest over dp
(:func:`shardlab.estimate.expert.rank_state_bytes`). With the fp8 policy the weights
add the linear layers' fp8 copies and scales under ZeRO 0-2
(:func:`shardlab.estimate.fp8.rank_state_bytes`).

Activations: :mod:`shardlab.estimate.activations` per layer (MoE layers with the
layout's ep, etp, capacity factor and a routing imbalance), times the layer
micro-batches each pipeline rank holds at its peak. Rank r of p holds, in units
of its own layers' micro-batches (capped by the m micro-batches of the step):

* GPipe: m (all forwards before any backward);
* 1F1B: p - r (Narayanan et al. 2021);
* ZB-H1: p on every rank (rank r postpones its W by r steps and activations stay
  until W: the first stage's 1F1B peak, Qi et al. 2024);
* ZB-H2: 2p - 1 on every rank (Qi et al. 2024);
* interleaved 1F1B, v chunks: Megatron-LM's warm-up count 2(p - r - 1) + (v - 1)p + 1
  chunk micro-batches, which on the first stage is p·(1 + (p-1)/(p·v)) stage
  micro-batches (Korthikanti et al. 2022 Sec. 4.2.3);
* ZB-V: p on every rank (2p half-size chunk micro-batches; Qi et al. 2024 Sec. 6);
* DualPipeV: p + 1/2 on every rank (2p + 1 half-size chunk micro-batches).

Every count is the peak that :mod:`shardlab.schedules.simulate` measures on the
generated schedule (``tests/schedules`` checks that they agree).

Each rank holds the layers of its model chunks: a Layout's ``stage_layers`` when it gives
them (uneven stages), else the even split, chunk c on rank c mod pp or in a V (zb-v,
dualpipev: the last chunk, with the head and its logits, back on rank 0):
:mod:`shardlab.estimate.partition`.

Context parallel (cp > 1): a rank keeps the activations of its s/cp tokens
(:func:`layer_bytes`: :func:`shardlab.estimate.context.cp_layer_activation_bytes`), so
every per-token term divides by cp (norm and projection inputs, Q, K, V, MLP hidden,
softmax statistics, the layer input under full recompute, the embedding's mask, the
head's input and the fp32 logits). What does not divide by cp: the K and V gathered
from the other cp ranks, (cp-1)/cp·b·s·2·kv_dim/t·e per layer, kept for backward by the
attention kernel; and, without a fused kernel, the scores of the rank's s/cp queries
against all s keys (divided by cp, not cp²). Model states divide by cp only through
ZeRO's shard group (dp_shard x cp, :func:`shardlab.estimate.states.zero_groups`).

Not modelled: allocator fragmentation, communication buffers, FSDP's transient
unsharded parameters, CUDA context and workspace (budget a few GB for them).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.config.layout import V_SCHEDULES, Layout
from shardlab.config.model import ModelShape
from shardlab.estimate import fp8
from shardlab.estimate.activations import (
    first_stage_extra_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
)
from shardlab.estimate.context import cp_layer_activation_bytes
from shardlab.estimate.expert import rank_params_split, rank_state_bytes
from shardlab.estimate.partition import chunk_rank, layout_chunk_layers
from shardlab.estimate.states import StateBytes, zero_state_bytes

__all__ = ["StageMemory", "StateBytes", "head_rank", "inflight_microbatches", "layer_bytes",
           "peak_stage", "stage_memory", "zero_state_bytes"]


def inflight_microbatches(schedule: str, pp: int, rank: int, microbatches: int,
                          virtual_stages: int = 1) -> float:
    """Peak micro-batches of its own layers that pipeline ``rank`` holds (module docstring).

    For interleaved 1F1B the count is in chunk micro-batches divided by v, so that
    it multiplies the rank's whole layer count like the others.
    """
    p, r, m, v = pp, rank, microbatches, virtual_stages
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(p - r, m))
    if schedule == "zb-h1":
        return float(min(p, m))
    if schedule == "zb-h2":
        return float(min(2 * p - 1, m))
    if schedule == "interleaved-1f1b":
        return min(2 * (p - r - 1) + (v - 1) * p + 1, m * v) / v
    if schedule == "zb-v":
        return float(min(p, m))
    if schedule == "dualpipev":
        return min(2 * p + 1, 2 * m) / 2
    raise ValueError(f"schedule={schedule!r}")


@dataclass(frozen=True)
class StageMemory:
    """Memory of one device of one pipeline stage, bytes."""

    stage: int
    params: int
    states: StateBytes
    activations: float
    inflight: float

    @property
    def total(self) -> float:
        """States plus activations."""
        return self.states.total + self.activations


def layer_bytes(m: ModelShape, layout: Layout, moe_layer: bool, dropout: bool,
                flash: bool = False, imbalance: float = 1.0,
                modules: tuple[str, ...] = ()) -> float:
    """Bytes one layer saves for backward per micro-batch on one rank of ``layout``:
    :func:`~shardlab.estimate.context.cp_layer_activation_bytes` (the rank's s/cp tokens,
    their queries against all s keys, the gathered K and V; the one-rank figure of
    :func:`~shardlab.estimate.activations.layer_activation_bytes` when cp = 1), plus what
    a router ``imbalance`` above 1 adds to a MoE layer's routed part."""
    lay = layout
    out = cp_layer_activation_bytes(m, lay, dropout=dropout, moe_layer=moe_layer, flash=flash,
                                    modules=modules)
    if moe_layer and imbalance != 1.0 and lay.recompute != "full":
        kw = {"tp": lay.tp, "sp": lay.sp, "recompute": lay.recompute, "dropout": dropout,
              "moe_layer": True, "flash": flash, "ep": lay.ep, "etp": lay.etp,
              "capacity_factor": lay.capacity_factor,
              "input_bytes": lay.dtype.input_bytes, "modules": modules,
              "combine_bytes": lay.dtype.combine_bytes}
        local = (m, lay.micro_batch, lay.seq // lay.cp, lay.dtype.activation_bytes)
        out += (layer_activation_bytes(*local, imbalance=imbalance, **kw)
                - layer_activation_bytes(*local, **kw))
    return out


def head_rank(layout: Layout) -> int:
    """The pipeline rank of the last model chunk, with the final norm, the head and the
    logits: pp - 1, or rank 0 when zb-v or dualpipev place the chunks in a V."""
    lay = layout
    return chunk_rank(lay.pp * lay.virtual_stages - 1, lay.pp, lay.schedule in V_SCHEDULES)


def stage_memory(m: ModelShape, layout: Layout, dropout: bool,
                 flash: bool = False, imbalance: float = 1.0,
                 modules: tuple[str, ...] = (), offload_layers: int = 0
                 ) -> list[StageMemory]:
    """Per pipeline stage: model states under ZeRO and peak activations (``imbalance``:
    the router's max/mean expert load, 1 for balanced routing; ``modules``: Megatron's
    recompute modules under selective recompute; ``offload_layers``: layers per rank whose
    activations are in host memory, :mod:`shardlab.plan.offload`)."""
    lay = layout
    e = lay.dtype.activation_bytes
    dense_bytes, moe_bytes = (layer_bytes(m, lay, moe, dropout, flash, imbalance, modules)
                              for moe in (False, True))
    # Sum the layers of each rank's chunks (dense layers first; chunk c on its rank).
    v_shape = lay.schedule in V_SCHEDULES
    rank_act = [0.0] * lay.pp
    rank_layers = [0] * lay.pp
    start = 0
    for c, n in enumerate(layout_chunk_layers(m, lay)):
        dense = max(0, min(n, m.dense_layers - start))
        r = chunk_rank(c, lay.pp, v_shape)
        rank_act[r] += dense * dense_bytes + (n - dense) * moe_bytes
        rank_layers[r] += n
        start += n
    # Offloaded layers keep their activations in host memory (the extras below stay).
    rank_act = [a * (1.0 - offload_layers / max(n, 1)) for a, n in zip(rank_act, rank_layers,
                                                                         strict=True)]
    params = [d + x for d, x in rank_params_split(m, lay)]
    # fp8: the linear weights' fp8 copies and scales count as weights (ZeRO 0-2).
    states = [s + StateBytes(f, 0.0, 0.0)
              for s, f in zip(rank_state_bytes(m, lay), fp8.rank_state_bytes(m, lay),
                              strict=True)]
    out = []
    local = lay.seq // lay.cp  # a context-parallel rank's tokens of each sequence
    head = head_rank(lay)
    for r in range(lay.pp):
        k = inflight_microbatches(lay.schedule, lay.pp, r, lay.microbatches, lay.virtual_stages)
        act = rank_act[r] * k
        if r == 0:
            act += k * first_stage_extra_bytes(m, lay.micro_batch, local, tp=lay.tp,
                                               sp=lay.sp, dropout=dropout)
        if r == head:
            # Logits live only from the loss to their backward, except under GPipe.
            last_k = k if lay.schedule == "gpipe" else 1.0
            act += last_k * last_stage_extra_bytes(m, lay.micro_batch, local, e,
                                                   tp=lay.tp, sp=lay.sp)
        out.append(StageMemory(r, params[r], states[r], act, k))
    return out


def peak_stage(stages: list[StageMemory]) -> StageMemory:
    """The stage with the largest total: the one that decides whether the layout fits."""
    return max(stages, key=lambda s: s.total)
