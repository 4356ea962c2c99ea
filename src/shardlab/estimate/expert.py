"""Expert parallelism: what a mixture-of-experts layer costs one rank (torch-free).

Placement (GShard, Lepikhin et al. 2020, arXiv 2006.16668; torchtitan and Megatron-LM
draw the expert-parallel group from the data-parallel ranks the same way): the ep
ranks of an expert-parallel group hold experts/ep of the routed experts each, rank j
the contiguous global ids j·E/ep .. (j+1)·E/ep - 1; each expert's width is split over
etp (1 or tp, Megatron-LM's ``--expert-tensor-parallel-size``). The router and the
shared experts (DeepSeekMoE, Dai et al. 2024) are dense parameters.

Tokens. A rank routes T tokens per micro-batch: T = b·s, or b·s/tp under sequence
parallelism with etp = 1 (each tensor-parallel rank routes its own slice of the
sequence to whole experts); with etp = tp the sequence is gathered first, as for the
dense MLP (Megatron-LM's MoE with sequence parallelism). Each token goes to its top-k
experts: T·k (token, expert) assignments per rank.

Capacity (Switch Transformer, Fedus et al. 2022, arXiv 2101.03961, Sec. 2.2; GShard):
with capacity factor c > 0 each expert takes at most C = ceil(c·T·k/E) of the
assignments of each source rank, the first C in token order; the rest are dropped
(not sent, routed output zero). c = 0 is dropless (Megablocks, Gale et al. 2022).

All-to-all (GShard Sec. 3; Megatron-LM's ``MoEAlltoAllTokenDispatcher``): dispatch
sends each kept assignment's row (d_model elements of the activation dtype) to the ep
rank holding its expert; combine sends the expert outputs back along the same routes,
so rank r's combine sends what it received in dispatch. Backward runs both again in
the opposite direction (the gradient of a dispatch is a combine and vice versa); full
recompute runs the forward pair a second time. Rows a rank sends to itself stay local
(``all_to_all_single`` copies them without the network). With balanced routing every
rank sends (ep-1)/ep of its kept rows in each of the 4 (6) all-to-alls of one MoE
layer and micro-batch.

Routed activations: the rank's experts take R rows per micro-batch, R = T·k with
balanced routing. The router's imbalance, max expert load / mean load (1 balanced),
raises the busiest rank's share to imbalance·T·k, capped by capacity (at most C rows
per expert from each of ep sources: E·C) and by the tokens that exist (ep·T·min(k,
E/ep)). Taking the busiest expert's load for all of the rank's experts is an upper
bound; it is exact with one expert per rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardlab.config.layout import V_SCHEDULES, Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.partition import (
    layout_stage_params,
    moe_layers_per_rank,
    stage_expert_params,
)
from shardlab.estimate.states import StateBytes, split_state_bytes, zero_groups


def routed_tokens(micro_batch: int, seq: int, tp: int = 1, sp: bool = False,
                  etp: int = 1) -> int:
    """T: tokens one rank routes per micro-batch: b·s, divided by tp under sequence
    parallelism when experts are whole (etp = 1) (module docstring)."""
    tokens = micro_batch * seq
    return tokens // tp if sp and etp == 1 else tokens


def layout_tokens(layout: Layout) -> int:
    """:func:`routed_tokens` of a layout: a context-parallel rank routes its s/cp tokens."""
    lay = layout
    return routed_tokens(lay.micro_batch, lay.seq // lay.cp, lay.tp, lay.sp, lay.etp)


def layout_moe_layers(m: ModelShape, layout: Layout) -> list[int]:
    """:func:`~shardlab.estimate.partition.moe_layers_per_rank` of a Layout: its uneven
    stages, and its chunks placed in a V for zb-v and dualpipev."""
    lay = layout
    return moe_layers_per_rank(m, lay.pp, lay.virtual_stages, lay.stage_layers,
                               lay.schedule in V_SCHEDULES)


def expert_capacity(m: ModelShape, tokens: int, capacity_factor: float) -> int | None:
    """Assignments each expert takes from one source rank routing ``tokens`` tokens:
    ceil(c·T·k/E) (Switch Transformer Sec. 2.2); None when dropless (c = 0)."""
    if not capacity_factor or m.moe is None:
        return None
    return math.ceil(capacity_factor * tokens * m.moe.experts_per_token / m.moe.experts)


def dispatch_rows(counts: Sequence[int], ep: int, capacity: int | None = None) -> list[int]:
    """Rows one source rank sends to each of the ep ranks in a dispatch: its assignment
    counts per global expert (len E), each capped at ``capacity``, summed over the
    contiguous block of E/ep experts each ep rank holds."""
    per_rank = len(counts) // ep
    kept = [c if capacity is None else min(c, capacity) for c in counts]
    return [sum(kept[j * per_rank:(j + 1) * per_rank]) for j in range(ep)]


def alltoall_send_bytes(rows_to_rank: Sequence[int], rank: int, row_bytes: int) -> int:
    """Bytes ``rank`` sends in one ``all_to_all_single``: its rows to every other rank
    (the rows addressed to itself are copied locally), each ``row_bytes`` long."""
    return sum(n for j, n in enumerate(rows_to_rank) if j != rank) * row_bytes


def layer_alltoall_bytes(counts: Sequence[Sequence[int]], ep_rank: int, row_bytes: int,
                         capacity: int | None = None) -> int:
    """Bytes ``ep_rank`` sends in one forward of one MoE layer for one micro-batch:
    dispatch + combine. ``counts[s][e]``: assignments source ep rank s routed to global
    expert e (before dropping). Combine returns to each source the rows it sent."""
    rows = [dispatch_rows(c, len(counts), capacity) for c in counts]
    dispatch = alltoall_send_bytes(rows[ep_rank], ep_rank, row_bytes)
    combine = alltoall_send_bytes([r[ep_rank] for r in rows], ep_rank, row_bytes)
    return dispatch + combine


def alltoall_passes(recompute: str) -> int:
    """Forward runs of each dispatch/combine pair per step, counting backward's mirror:
    2, or 3 with full recompute (forward again before backward)."""
    return 3 if recompute == "full" else 2


def expert_alltoall_bytes(m: ModelShape, layout: Layout,
                          routed: Sequence[Sequence[Sequence[int]]] | None = None, *,
                          ep_rank: int | None = None, stage: int | None = None) -> float:
    """Bytes one rank sends per step in expert-parallel all-to-alls: dispatch + combine,
    forward + backward (and forward again under full recompute), over all MoE layers
    of its pipeline stage and all micro-batches (module docstring).

    ``routed=None``: balanced routing, the mean rank, on pipeline ``stage`` (None: the
    stage with the most MoE layers). ``routed``: the count matrices the router produced
    in one step on this rank's ep group, one ``[ep][experts]`` matrix per MoE layer of
    the stage and micro-batch (the step's whole list, a recomputed forward not listed
    again: it routes the same; ``stage`` is then ignored); the bytes of ``ep_rank``
    (None: the busiest ep rank).
    """
    lay = layout
    if m.moe is None or lay.ep == 1:
        return 0.0
    row_bytes = m.d_model * lay.dtype.activation_bytes
    tokens = layout_tokens(lay)
    cap = expert_capacity(m, tokens, lay.capacity_factor)
    passes = alltoall_passes(lay.recompute)
    if routed is not None:
        ranks = range(lay.ep) if ep_rank is None else [ep_rank]
        return float(max(passes * sum(layer_alltoall_bytes(c, r, row_bytes, cap)
                                      for c in routed) for r in ranks))
    layers = layout_moe_layers(m, lay)
    n = max(layers) if stage is None else layers[stage]
    assignments = tokens * m.moe.experts_per_token
    kept = assignments if cap is None else min(assignments, cap * m.moe.experts)
    per_layer = 2.0 * (lay.ep - 1) / lay.ep * kept * row_bytes  # dispatch + combine
    return passes * lay.microbatches * n * per_layer


def routed_rows(m: ModelShape, tokens: int, ep: int = 1, capacity_factor: float = 0.0,
                imbalance: float = 1.0) -> float:
    """R: rows the busiest rank's experts take per micro-batch and MoE layer when each of
    the ep ranks routes ``tokens``: min(imbalance·T·k, E·C, ep·T·min(k, E/ep)) (module
    docstring)."""
    if m.moe is None:
        return 0.0
    if not math.isfinite(imbalance) or imbalance < 1:
        raise ValueError(f"imbalance={imbalance!r}: max/mean expert load is >= 1")
    e = m.moe
    rows = min(imbalance * tokens * e.experts_per_token,
               ep * tokens * min(e.experts_per_token, e.experts // ep))
    cap = expert_capacity(m, tokens, capacity_factor)
    return float(rows if cap is None else min(rows, e.experts * cap))


def routed_activation_bytes(m: ModelShape, tokens: int, elem_bytes: int = 2, *, ep: int = 1,
                            etp: int = 1, capacity_factor: float = 0.0,
                            imbalance: float = 1.0, eager: bool = False,
                            input_bytes: int | None = None, act_recompute: bool = False,
                            combine_bytes: int | None = None,
                            rows: tuple[float, float] | None = None) -> float:
    """Bytes one MoE layer's routed part saves for backward per micro-batch on one rank
    that routes ``tokens`` (:func:`routed_tokens`).

    With R routed rows (:func:`routed_rows`), S = the rank's own kept assignments
    returned by combine, e = ``elem_bytes``, d = d_model, f = expert_d_ff:

    * R·d·e: the dispatched rows, the experts' input;
    * R·f·e·{2 GELU, 3 SwiGLU (4 ``eager``: silu(gate) kept too)}/etp: the expert hidden
      activations, split over etp like a dense MLP's (Korthikanti et al. 2022's MLP terms);
    * S·d·c: the combined expert outputs, kept to weight them by the router's gates
      (c = ``combine_bytes``, default e; 0 where the gates are applied inside the experts'
      activation, Megatron-Core from core_v0.13: ``WeightedSwiGLUFunction`` saves the fc1
      output and one gate per row, and the unpermute gets no probs; 4 where torchtitan
      multiplies an fp32 upcast, ``routed_output.to(torch.float32) * top_scores``);
    * 4·T·E: the router's fp32 softmax output (Mixtral routes in float32).

    With ``input_bytes`` (Transformer Engine's fp8: 1) the experts' two matmul inputs,
    the dispatched rows and the down projection's input, take that many bytes
    (:mod:`shardlab.estimate.activations`); the first matmul's outputs stay at e.

    ``act_recompute`` (Megatron's ``--recompute-modules moe_act``): the down projection's
    input is not kept; the activation runs again from the first matmul's outputs.

    ``rows``: the (R, S) of one rank in a measured micro-batch (``shardlab train``'s report,
    from its routing counts: the rows its experts took, the rows its combine weights), in
    place of R from ``imbalance`` and S = min(T·k, E·C): a rank whose experts took fewer
    rows than a balanced one's keeps less.

    Full recompute keeps none of these (only the layer input, counted by the caller).
    """
    if m.moe is None:
        return 0.0
    if rows is not None:
        received, own = rows
    else:
        received = routed_rows(m, tokens, ep, capacity_factor, imbalance)
        cap = expert_capacity(m, tokens, capacity_factor)
        own = tokens * m.moe.experts_per_token
        own = own if cap is None else min(own, cap * m.moe.experts)
    e = elem_bytes
    li = e if input_bytes is None else input_bytes
    hidden = (1 if m.style == "gpt" else 3 if eager else 2) * e + (0 if act_recompute else li)
    return (received * m.d_model * li + received * hidden * m.moe.expert_d_ff / etp
            + own * m.d_model * (e if combine_bytes is None else combine_bytes)
            + 4.0 * tokens * m.moe.experts)


def moe_flops_per_token(m: ModelShape) -> dict[str, float]:
    """Forward FLOPs per token of the MoE layers' parts, all MoE layers: the router
    2·d·E, the top-k routed experts 2·mats·d·k·f, the shared experts 2·mats·d·S·f_s
    (GShard / Switch count only the k experts a token visits; mats = 2 GELU, 3 SwiGLU)."""
    if m.moe is None:
        return {"router": 0.0, "routed": 0.0, "shared": 0.0}
    e, d, n = m.moe, m.d_model, m.moe_layers
    return {"router": 2.0 * n * d * e.experts,
            "routed": 2.0 * n * m.mlp_matrices * d * e.experts_per_token * e.expert_d_ff,
            "shared": 2.0 * n * m.mlp_matrices * d * e.shared_experts * e.shared_d_ff}


def rank_params_split(m: ModelShape, layout: Layout, vocab_parallel: bool = True
                      ) -> list[tuple[int, int]]:
    """(dense, routed-expert) parameters on one rank of each pipeline rank, with ep, etp,
    uneven stages and the V placement
    (:func:`~shardlab.estimate.partition.layout_stage_params`)."""
    lay = layout
    total = layout_stage_params(m, lay, vocab_parallel)
    experts = stage_expert_params(m, lay.pp, lay.virtual_stages, lay.ep, lay.etp,
                                  lay.stage_layers, lay.schedule in V_SCHEDULES)
    return [(t - x, x) for t, x in zip(total, experts, strict=True)]


def rank_state_bytes(m: ModelShape, layout: Layout, vocab_parallel: bool = True
                     ) -> list[StateBytes]:
    """Weights, gradients and optimizer bytes on one rank of each pipeline rank: dense
    parameters under ZeRO over their shard group (dp, times cp, over dp_shard under HSDP),
    routed experts over theirs (expert_dp = dp/ep times cp):
    :func:`~shardlab.estimate.states.zero_groups`, :mod:`shardlab.estimate.states`."""
    lay = layout
    g = zero_groups(lay)
    return [split_state_bytes(d, x, lay.dtype, lay.zero, g.dense, g.experts)
            for d, x in rank_params_split(m, lay, vocab_parallel)]


def ep_members_per_node(ep: Any, etp: Any, cp: Any, gpus_per_node: int) -> Any:
    """Members of an ep group in one node (ints or numpy arrays of them): the group is drawn
    from the dp ranks, strided by the cp ranks between them, so it spans ep·etp·cp
    consecutive ranks: all ep while that fits a node of ``gpus_per_node``, else
    gpus_per_node/(etp·cp), at least 1."""
    return np.where(ep * etp * cp <= gpus_per_node, ep,
                    np.maximum(gpus_per_node // (etp * cp), 1))
