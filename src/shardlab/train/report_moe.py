"""A mixture-of-experts run's document: what the routers did, and the expert-parallel
figures of the cost model computed from it (:mod:`shardlab.estimate.expert`).

Every rank records, in its measured step, each MoE forward's assignments per global
expert before dropping and the assignments capacity dropped
(:class:`~shardlab.distributed.expert_parallel.RoutingRecorder`). The ranks of one
expert-parallel group run the same forwards in the same order, so the i-th records of
its ep ranks form the ``[ep][experts]`` count matrix of one all-to-all; from those the
cost model predicts each rank's all-to-all bytes, which the comm meter counts from the
real split sizes (they must be equal). Tensor-parallel ranks route the same tokens
(experts whole on each, etp = 1), so only tensor rank 0's records are counted once.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from shardlab.config.layout import Layout, make_layout
from shardlab.estimate.comm import (
    attention_rows,
    experts_cut_on_dim1,
    fsdp2_padded,
    ring_allreduce_bytes,
    tensor_rows,
)
from shardlab.estimate.comm_dtensor import fp8_block_bytes
from shardlab.estimate.expert import (
    dispatch_rows,
    expert_alltoall_bytes,
    expert_capacity,
    layout_tokens,
)
from shardlab.estimate.fp8 import tp_fp8_linears
from shardlab.estimate.partition import chunk_layers
from shardlab.train.config import estimate_dtype, layout_recompute, under_autocast


def run_layout(cfg: Any) -> Layout:
    """The run's :class:`Layout` (ZeRO-3 under FSDP over dp x cp > 1 ranks, the dtype
    policy, ep, cp, uneven stages, HSDP)."""
    share = cfg.global_batch // cfg.dp
    zero = 0 if cfg.grad_ranks == 1 or cfg.dp_mode == "ddp" else 3
    return make_layout(cfg.shape, dp=cfg.dp, tp=cfg.tp, pp=cfg.pp,
                       virtual_stages=cfg.virtual_stages, sp=cfg.sp, zero=zero,
                       micro_batch=cfg.micro_batch or share, global_batch=cfg.global_batch,
                       seq=cfg.seq, recompute=layout_recompute(cfg.recompute),
                       dtype=estimate_dtype(cfg),
                       schedule=cfg.schedule if cfg.pp > 1 else None, ep=cfg.ep,
                       etp=cfg.etp, capacity_factor=cfg.capacity_factor, cp=cfg.cp,
                       stage_layers=cfg.stage_layers, dp_replicate=cfg.dp_replicate)


def _routing_ranks(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in ranks if r.get("tp_rank", 0) == 0 and r.get("routing")]


def routing_summary(cfg: Any, ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measured step's routing: per MoE layer the assignments per expert summed over
    every rank and micro-batch, its imbalance (max / mean expert load; 1 is balanced),
    and the assignments capacity dropped; None for a dense model."""
    if cfg.shape.moe is None:
        return None
    loads: dict[str, list[int]] = {}
    dropped: dict[str, int] = defaultdict(int)
    for r in _routing_ranks(ranks):
        for rec in r["routing"]:
            old = loads.setdefault(rec["layer"], [0] * len(rec["counts"]))
            loads[rec["layer"]] = [a + b for a, b in zip(old, rec["counts"], strict=True)]
            dropped[rec["layer"]] += rec["dropped"]
    layers = {key: {"load": load, "imbalance": max(load) / (sum(load) / len(load)),
                    "dropped": dropped[key], "assignments": sum(load)}
              for key, load in sorted(loads.items(), key=lambda kv: int(kv[0]))}
    total = sum(v["assignments"] for v in layers.values())
    return {"imbalance": max((v["imbalance"] for v in layers.values()), default=1.0),
            "dropped": sum(dropped.values()), "assignments": total,
            "dropped_share": sum(dropped.values()) / total if total else 0.0,
            "per_layer": layers}


def ep_groups(cfg: Any, ranks: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Each rank's expert-parallel group, by global rank: its ep ranks in ep order."""
    groups: dict[tuple[int, int, int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in ranks:  # ep innermost in dp; one group per cp rank (mesh.py)
        groups[r["pp_rank"], r["tp_rank"], r.get("cp_rank", 0), r["dp_rank"] // cfg.ep
               ].append(r)
    out = {}
    for members in groups.values():
        members.sort(key=lambda r: r["ep_rank"])
        for r in members:
            out[r["rank"]] = members
    return out


def predicted_ep_bytes(cfg: Any, layout: Layout, rank: dict[str, Any],
                       group: list[dict[str, Any]]) -> float:
    """The cost model's all-to-all bytes of ``rank`` in the measured step, from the count
    matrices its ep group's routers produced (:func:`~shardlab.estimate.expert.
    expert_alltoall_bytes` with ``routed``)."""
    records = [r["routing"] for r in group]
    routed = [[recs[i]["counts"] for recs in records] for i in range(len(records[0]))]
    return expert_alltoall_bytes(cfg.shape, layout, routed, ep_rank=rank["ep_rank"])


def moe_flops_correction(cfg: Any, tokens: int, summary: dict[str, Any] | None) -> float:
    """FLOPs the cost model's per-token figure misses or counts in a MoE step: each
    tensor-parallel rank runs the router whole, and the routed experts whole too with
    etp = 1 (tp - 1 more copies of them); assignments dropped by capacity are never
    computed. Forward 2, backward 4 FLOPs per weight a row passes (Kaplan et al. 2020's
    6N; 8N when full recompute runs the forward again)."""
    m = cfg.shape
    if m.moe is None or summary is None:
        return 0.0
    copies = cfg.tp if cfg.etp == 1 else 1  # of each routed expert's FLOPs
    expert = m.mlp_matrices * m.d_model * m.moe.expert_d_ff
    router = m.moe_layers * tokens * m.d_model * m.moe.experts
    routed = m.moe_layers * m.moe.experts_per_token * tokens * expert
    per_weight = 8.0 if cfg.recompute == "full" else 6.0  # full recompute: forward twice
    return per_weight * ((cfg.tp - 1) * router + (copies - 1) * routed
                         - copies * summary["dropped"] * expert)


def moe_padded_params(cfg: Any, position: int | None = None,
                      expert_position: int | None = None) -> list[tuple[int, int]]:
    """(dense, expert) elements FSDP2 gathers and reduce-scatters on one rank of each
    pipeline rank: the dense parameters with dim 0 padded to a multiple of dp, the
    routed experts' local [E/ep, ...] shards padded to a multiple of expert_dp
    (:func:`~shardlab.estimate.comm.fsdp2_padded_params`'s rule, per group); without
    expert parallelism the experts are dense ones (padded over dp); fewer local experts than
    their shards are cut on dim 1 (:func:`~shardlab.estimate.comm.experts_cut_on_dim1`).
    With ``position`` and
    ``expert_position`` (a rank's places in the dp and expert_dp groups): the elements that
    rank holds instead (:func:`~shardlab.estimate.comm.fsdp2_padded`)."""
    # FSDP's shard group: dp, or one HSDP replica's dp/R, times cp; the experts' (dp/R)/ep
    # times cp (the ranks holding the same experts: mesh.py's _expert_views).
    dp = cfg.dp // cfg.dp_replicate * cfg.cp
    m, edp, tp = cfg.shape, expert_shard_ranks(cfg), cfg.tp
    assert m.moe is not None
    e = m.moe
    block, first, last = tensor_rows(m, tp, not m.tied and tp > 1)
    f, d, fs = e.expert_d_ff, m.d_model, e.shared_experts * e.shared_d_ff // tp
    attention = attention_rows(m, tp)
    shared = [(fs, d)] * (m.mlp_matrices - 1) + [(d, fs)] if fs else []
    if fs and m.biases:
        shared += [(fs, 1), (d, 1)]
    router = [(e.experts, d)] + ([(e.experts, 1)] if e.router_bias else [])
    local, fl = e.experts // cfg.ep, f // cfg.etp  # experts whole, or their width over tp
    experts = [(local, d * fl)] * m.mlp_matrices + ([(local, fl), (local, d)]
                                                     if m.biases else [])
    if experts_cut_on_dim1(local, edp, cfg.etp > 1):
        # Fewer local experts than shards: FSDP2 cuts them on dim 1:
        # gate and up [E/ep, d, f] by d, down [E/ep, f, d] by f, biases by their width.
        experts = ([(d, local * f)] * (m.mlp_matrices - 1) + [(f, local * d)]
                   + ([(f, local), (d, local)] if m.biases else []))

    out = []
    moe_block = fsdp2_padded(attention + shared + router, dp, position)
    for r in range(cfg.pp):
        ids = stage_layer_ids(cfg, r)
        moe_here = sum(1 for i in ids if i >= e.dense_layers)
        n = moe_here * moe_block + (len(ids) - moe_here) * fsdp2_padded(block, dp, position)
        if r == 0:
            n += fsdp2_padded(first, dp, position)
        if r == cfg.pp - 1:
            n += fsdp2_padded(last[:-1] if m.tied and cfg.pp == 1 else last, dp, position)
        if cfg.ep == 1:  # no expert parallelism: the experts are FSDP's like the rest
            out.append((n + moe_here * fsdp2_padded(experts, dp, position), 0))
        else:
            out.append((n, moe_here * fsdp2_padded(experts, edp, expert_position)))
    return out


def expert_shard_ranks(cfg: Any) -> int:
    """Ranks FSDP shards the routed experts over with expert parallelism: the (dp/R)/ep
    ranks of one HSDP replica holding the same experts, times cp (every cp rank holds
    them too)."""
    return cfg.dp // cfg.dp_replicate // cfg.ep * cfg.cp


def expert_shard_position(cfg: Any, rank: dict[str, Any]) -> int:
    """``rank``'s place in the experts' shard group (:func:`expert_shard_ranks`; the
    expert mesh's ``edp`` dim: dp_shard // ep major, cp inside)."""
    shard = rank["dp_rank"] % (cfg.dp // cfg.dp_replicate)
    return shard // cfg.ep * cfg.cp + rank.get("cp_rank", 0)


def stage_layer_ids(cfg: Any, pp_rank: int) -> list[int]:
    """Layer indices pipeline rank ``pp_rank`` holds: chunk c of
    :func:`~shardlab.estimate.partition.chunk_layers` lives on rank c mod pp."""
    ids, start = [], 0
    for c, n in enumerate(chunk_layers(cfg.shape.layers, cfg.pp, cfg.virtual_stages,
                                       cfg.stage_layers)):
        if c % cfg.pp == pp_rank:
            ids += range(start, start + n)
        start += n
    return ids


def rank_rows(cfg: Any, layout: Layout, rank: dict[str, Any],
              group: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """Per MoE layer of ``rank``, the (R, S) rows of the measured micro-batches
    (:func:`shardlab.estimate.expert.routed_activation_bytes`): R the rows its experts took
    from every member of its expert group, a micro-batch's, as the saved-tensor meter
    counts them; S = T·k, its own assignments, every one: shardlab's unpermute
    (:func:`shardlab.nn.moe.unpermute`) pads the rows capacity dropped back with zeros and
    weights all T·k. Without a pipeline the activations are measured on the step's first
    micro-batch, so that one's rows; in a pipeline the mean over the step's micro-batches.
    Until 2026-12-07 R was held at a balanced rank's T·k or more (the cost model's busiest
    rank): the capacity run's ranks, whose experts took fewer rows, read 0.924 and 0.990 of
    that count, 1.024 and 1.026 with their own R, and 1.005 once the router's own tensors
    were counted as well (:func:`router_extra_bytes`)."""
    m = cfg.shape
    assert m.moe is not None
    tokens = layout_tokens(layout)
    cap = expert_capacity(m, tokens, layout.capacity_factor)
    rows: dict[int, list[int]] = defaultdict(list)
    for i, rec in enumerate(rank["routing"]):
        counts = [member["routing"][i]["counts"] for member in group]
        rows[int(rec["layer"])].append(
            sum(dispatch_rows(c, cfg.ep, cap)[rank["ep_rank"]] for c in counts))
    used = {key: got[:1] if cfg.pp == 1 else got for key, got in rows.items()}
    own = float(tokens * m.moe.experts_per_token)
    return {key: (sum(got) / len(got), own) for key, got in used.items()}


def expert_tp_bytes(cfg: Any, layout: Layout, rank: dict[str, Any],
                    group: list[dict[str, Any]]) -> float:
    """Tensor-parallel bytes of ``rank``'s experts in the measured step with etp = tp: per
    MoE forward the partial outputs of the R rows its experts took are all-reduced over
    tp, and in backward their input gradients (Megatron-LM's g and f), R·d elements of
    the activation dtype each (ring all-reduce); full recompute re-runs the forward one."""
    m = cfg.shape
    if m.moe is None or cfg.etp == 1 or cfg.tp == 1 or not rank.get("routing"):
        return 0.0
    cap = expert_capacity(m, layout_tokens(layout), layout.capacity_factor)
    rows = sum(sum(dispatch_rows(member["routing"][i]["counts"], cfg.ep, cap)[rank["ep_rank"]]
                   for member in group) for i in range(len(rank["routing"])))
    passes = 3 if cfg.recompute == "full" else 2
    return passes * ring_allreduce_bytes(rows * m.d_model * layout.dtype.activation_bytes,
                                         cfg.tp)


def moe_tp_bytes(cfg: Any, layout: Layout) -> list[float]:
    """What a MoE layer's MLP changes in :func:`~shardlab.estimate.comm_dtensor.
    tp_bytes_dtensor`'s dense count, per pipeline rank (bytes, signed), with etp's experts
    apart (:func:`expert_tp_bytes`):

    * without shared experts its MLP is the router and the experts, which send nothing
      over tp: less the dense MLP's two all-reduces (its output's and, backward, its
      input gradient's; train refuses sequence parallelism with experts);
    * with them, as the dense MLP: their input enters once (``mlp.shared``'s prepared
      input), so backward all-reduces one gradient, and their output one all-reduce;
    * with them, under full recompute with an auxiliary loss attached after the shared
      experts, torch's checkpoint cannot stop before their output projection (the
      auxiliary loss's input is saved after it), so it re-runs that all-reduce too: one
      more than a dense block.

    * with ``--dtype fp8``, a MoE block's fp8 linears (its shared experts' beside the
      attention's; its MLP input gathered in bf16) in place of a dense block's
      (:func:`~shardlab.estimate.comm_dtensor.fp8_block_bytes`); with
      ``--fp8-all-gather`` their weights' casts reduce no amax and the step's amax
      all-reduce holds the MoE block's fp8 weights, not the dense block's.

    Per micro-batch and MoE layer of the rank, ring all-reduces of b·(s/cp)·d: the output
    projection's at the activations' bytes, the column-parallel inputs' gradients at fp32
    under autocast (bf16 without FSDP's mixed precision: the norm before them is fp32, as
    ``tp_bytes_dtensor(autocast=True)`` counts them)."""
    m = cfg.shape
    if m.moe is None or cfg.tp == 1:
        return [0.0] * cfg.pp
    elements = layout.micro_batch * (layout.seq // layout.cp) * m.d_model  # a cp rank's
    ar = ring_allreduce_bytes(elements * layout.dtype.activation_bytes, cfg.tp)
    autocast = under_autocast(cfg)
    ar_wide = ring_allreduce_bytes(elements * 4, cfg.tp) if autocast else ar
    # The dense block's MLP input all-reduces one gradient and its output one (train runs
    # no sequence parallelism with experts; MODULE_INPUTS); a MoE's shared experts the
    # same, their own input prepared once (the router reads the MLP input as it is).
    if not m.moe.shared_experts:
        per_layer = -(ar + ar_wide)
    else:
        per_layer = ar if cfg.recompute == "full" and has_aux(cfg) else 0.0
    per_step = 0.0
    if cfg.dtype == "fp8":  # the MoE block's fp8 linears in place of the dense block's
        norm_bytes = 4 if autocast else layout.dtype.activation_bytes
        again = cfg.recompute in ("full", "op")
        linears = {moe: tp_fp8_linears(m, cfg.tp, moe) for moe in (True, False)}
        per_layer += sum(sign * fp8_block_bytes(m, layout, linears[moe], elements, again,
                                                norm_bytes, prescaled=cfg.fp8_all_gather)
                         for sign, moe in ((1, True), (-1, False)))
        if cfg.fp8_all_gather:  # the step's amaxes: of the MoE block's fp8 weights
            per_step = ring_allreduce_bytes(4 * (len(linears[True]) - len(linears[False])),
                                            cfg.tp)
    return [(layout.microbatches * per_layer + per_step)
            * sum(1 for i in stage_layer_ids(cfg, r) if i >= m.moe.dense_layers)
            for r in range(cfg.pp)]


def has_aux(cfg: Any) -> bool:
    """Whether the MoE layers attach an auxiliary loss (a load-balancing or z-loss weight)."""
    return cfg.aux_coef > 0 or cfg.z_coef > 0


def router_extra_bytes(cfg: Any, recompute: str, e: int) -> float:
    """What one MoE layer of shardlab's eager program keeps around its router and its
    permutation beyond the cost model's routed part (which counts the router's fp32
    softmax, 4·T·E), per micro-batch, for the T tokens the rank routes: the top-k's int64
    expert ids (8·T·k) and fp32 values with their sum (4·T·k + 4·T, kept to renormalise),
    the k weights in the compute dtype (e·T·k, kept to weight the experts' outputs), the
    permutation's and its inverse's int64 indices (16·T·k); with capacity the boolean keep
    mask (T·k); with the load-balancing loss (``aux_coef``) its own softmax (4·T·E) and the
    experts' shares (4·E), with the z-loss (``z_coef``) the fp32 logits and their
    log-sum-exp (4·T·E + 4·T), with either the loss scalar AttachAuxLoss keeps (4). None
    under full recompute or per-operator checkpointing (the block keeps its input only).
    Measured per storage with saved-tensor hooks on one MoE layer (2026-12-07: T = 256,
    k = 2, E = 8, fp32 with aux_coef 0.01: 25,636 B beyond the count, as this gives; bf16,
    capacity and the z-loss each as this gives); the MoE train runs read 1.02-1.03 of the
    count without it."""
    m = cfg.shape
    if m.moe is None or recompute not in ("none", "selective"):
        return 0.0
    lay = run_layout(cfg)
    t = layout_tokens(lay)
    k, experts = m.moe.experts_per_token, m.moe.experts
    out = t * k * (8 + 4 + e + 16) + 4 * t
    if cfg.capacity_factor > 0:
        out += t * k
    if cfg.aux_coef:
        out += 4 * t * experts + 4 * experts
    if cfg.z_coef:
        out += 4 * t * experts + 4 * t
    if cfg.aux_coef or cfg.z_coef:
        out += 4
    return float(out)
