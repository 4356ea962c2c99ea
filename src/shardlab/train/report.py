"""A training run's document: measured beside the cost model's prediction for the same
shape and layout (FLOPs, state bytes, communication, activations), and parity with one
process. Built on rank 0's side from what every rank returned."""

from __future__ import annotations

import statistics
from typing import Any

from shardlab.config.dtypes import get_policy
from shardlab.config.measured import accelerator_or_measured, load_measurement
from shardlab.estimate.comm import (
    embedding_sync_bytes,
    fsdp2_padded_params,
    pp_bytes_per_rank,
)
from shardlab.estimate.comm_dtensor import tp_bytes_dtensor
from shardlab.estimate.context import cp_bytes_per_stage, local_layout
from shardlab.estimate.expert import rank_state_bytes
from shardlab.estimate.flops import flops_per_token
from shardlab.estimate.fp8 import tp_fp8_linears
from shardlab.estimate.memory import StateBytes, inflight_microbatches, zero_state_bytes
from shardlab.estimate.partition import stage_params
from shardlab.train.config import bf16_compute, estimate_dtype, loss_split, under_autocast
from shardlab.train.report_activations import predicted_activation_bytes
from shardlab.train.report_cp import (
    dp_bytes,
    fp8_gathered,
    kept_padded,
    layout_keys,
    replica_bytes,
    shard_position,
    shard_ranks,
)
from shardlab.train.report_fsdp import rank_params, vocab_parallel
from shardlab.train.report_moe import (
    ep_groups,
    expert_shard_position,
    expert_shard_ranks,
    expert_tp_bytes,
    has_aux,
    moe_flops_correction,
    moe_padded_params,
    moe_tp_bytes,
    predicted_ep_bytes,
    rank_rows,
    routing_summary,
    run_layout,
)
from shardlab.train.report_temporaries import predicted_temporary_bytes


def report(cfg: Any, ranks: list[dict[str, Any]], reference: list[float] | None,
           log_dir: str, peak: float | None = None) -> dict[str, Any]:
    """Measured beside predicted, and parity with one process."""
    r0 = ranks[0]
    losses = r0["losses"]
    tokens = cfg.global_batch * cfg.seq
    step_s = statistics.median(r0["step_seconds"][1:] or r0["step_seconds"])
    # The CPU attention kernel is fused (flash): its backward recomputes the scores.
    fpt = flops_per_token(cfg.shape, cfg.seq, cfg.recompute, flash=True)
    routing = routing_summary(cfg, ranks)
    # What the ranks compute together: the model's FLOPs (with recompute), plus the tied head
    # that each tensor-parallel rank computes whole (and a MoE's router and experts).
    # (flops_per_token adds the fused kernel's backward recompute of the scores, half the
    # attention core's forward, only without recompute or under per-operator
    # checkpointing; it happens under selective and full recompute too.)
    flash = fpt.attention / 2 * tokens if cfg.recompute in ("selective", "full") else 0.0
    predicted_flops = (fpt.hardware_train * tokens + replicated_head_flops(cfg, tokens)
                       - early_stop_flops(cfg, tokens) + flash
                       + moe_flops_correction(cfg, tokens, routing))
    measured_flops = measured_step_flops(ranks)
    act_rows = activation_table(cfg, ranks)
    act = act_rows[0]
    memory = []
    for r, a in zip(ranks, act_rows, strict=True):
        pred = predicted_state_bytes(cfg, r["pp_rank"], r)
        held = held_microbatches(cfg, r["pp_rank"])
        memory.append({"rank": r["rank"], "measured": r["state_bytes"],
                       "predicted": {"weights": pred.weights, "gradients": pred.gradients,
                                     "optimizer": pred.optimizer},
                       "activations": {"in_flight": held,
                                       "measured": a["measured"] * held
                                       if a["measured"] else None,
                                       "predicted": a["predicted"] * held},
                       "cuda_peak_allocated": r.get("cuda_peak_allocated")})
    comm_rows = comm_table(cfg, ranks)
    moe = (f" ep={cfg.ep} etp={cfg.etp} capacity_factor={cfg.capacity_factor:g}"
           f" aux_coef={cfg.aux_coef:g} z_coef={cfg.z_coef:g}"
           if cfg.shape.moe is not None else "")
    doc: dict[str, Any] = {
        "model": cfg.shape.describe(),
        "layout": f"dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} {cfg.dp_mode} sp={int(cfg.sp)} "
                  f"recompute={cfg.recompute} schedule={cfg.schedule} dtype={cfg.dtype}{moe}"
                  f"{layout_keys(cfg)}",
        "world_size": len(ranks), "steps": cfg.steps, "log_dir": log_dir,
        "measured_step": r0.get("measured_step"),
        "losses": losses, "grad_norms": r0["grad_norms"],
        "step_seconds": statistics.median(r0["step_seconds"]),
        "tokens_per_s": tokens / step_s,
        "mfu": fpt.train * tokens / step_s / peak if peak else None,
        "hfu": fpt.hardware_train * tokens / step_s / peak if peak else None,
        "peak_flops": peak,
        "memory_per_rank": memory,
        "comm_bytes_per_step": comm_rows,
        "routing": routing,
        "routing_imbalance": routing["imbalance"] if routing else None,
        "predicted_vs_measured": {
            "flops_per_step": {"predicted": predicted_flops, "measured": measured_flops,
                               "ratio": measured_flops / predicted_flops},
            "comm_bytes_per_step": comm_rows,
            "activation_bytes_per_microbatch": {
                "predicted": act["predicted"], "measured": act["measured"],
                "ratio": act["ratio"], "per_rank": act_rows},
        },
    }
    if reference is not None:
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
        tol = 1e-5 if cfg.dtype == "fp32" else 2e-2
        doc.update({"reference_losses": reference, "max_loss_diff": diff,
                    "parity_tolerance": tol, "parity_passed": diff <= tol})
    return doc


def activation_table(cfg: Any, ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank, the bytes its stages keep for backward for one micro-batch (measured with
    saved-tensor hooks around every forward of the measured step, divided by the
    micro-batches) beside the cost model: the layers the rank holds x
    ``layer_activation_bytes`` for shardlab's eager LM (no dropout; the CPU attention
    kernel is fused, keeping only softmax statistics), plus the embedding's and the head's
    extras on the ranks holding the first and last chunk."""
    rows = []
    groups = ep_groups(cfg, ranks) if cfg.shape.moe is not None else {}
    for r in ranks:
        routed = (rank_rows(cfg, run_layout(cfg), r, groups[r["rank"]])
                  if r["rank"] in groups and r.get("routing") else None)
        predicted = predicted_activation_bytes(cfg, r["pp_rank"], routed)
        measured = r.get("activation_bytes")
        rows.append({"rank": r["rank"], "predicted": predicted, "measured": measured,
                     "ratio": measured / predicted if measured else None})
    return rows


def predicted_state_bytes(cfg: Any, pp_rank: int,
                          rank: dict[str, Any] | None = None) -> StateBytes:
    """Weights, gradients and AdamW moments (bytes) a rank of pipeline stage ``pp_rank``
    holds: its parameters under ZeRO-3 over FSDP's shard group (dp x cp; dp/R x cp under
    HSDP; a mixture of experts' routed experts over expert_dp) or replicated (DDP, or one
    rank). Under FSDP, ``rank``'s own ``torch.chunk`` of every parameter (its place in
    the shard group, :func:`~shardlab.estimate.comm.fsdp2_padded`; the group's first
    rank when None): where a dim 0 does not divide the group, the first ranks hold a row
    more than the mean."""
    policy = get_policy(estimate_dtype(cfg))
    n = shard_ranks(cfg)
    if cfg.grad_ranks > 1 and cfg.dp_mode != "ddp" and n > 1:
        pos = shard_position(cfg, rank) if rank is not None else 0
        if cfg.shape.moe is not None:
            # Experts shard over expert_dp: the edp index, ep innermost in dp; without ep
            # they sit in the block's unit, at the rank's place in its shard group.
            epos = ((pos if cfg.ep == 1 else expert_shard_position(cfg, rank))
                    if rank is not None else 0)
            local = sum(moe_padded_params(cfg, pos, epos)[pp_rank])
        else:
            local = fsdp2_padded_params(cfg.shape, cfg.tp, cfg.pp, n, cfg.virtual_stages,
                                        vocab_parallel=vocab_parallel(cfg),
                                        stage_layers=cfg.stage_layers, position=pos)[pp_rank]
        return zero_state_bytes(local, policy, 0, 1)
    if cfg.shape.moe is not None:  # experts sharded over expert_dp, the rest over dp
        return rank_state_bytes(cfg.shape, run_layout(cfg), vocab_parallel(cfg))[pp_rank]
    return zero_state_bytes(rank_params(cfg, pp_rank), policy, 0, 1)


def held_microbatches(cfg: Any, pp_rank: int) -> float:
    """Micro-batches whose saved activations a rank holds at the step's peak: one without a
    pipeline (each is freed by its backward), the schedule's in-flight count in one."""
    if cfg.pp == 1:
        return 1
    return inflight_microbatches(cfg.schedule, cfg.pp, pp_rank, cfg.microbatches,
                                 cfg.virtual_stages)


def predicted_peak_bytes(cfg: Any) -> float:
    """The cost model's peak bytes of the fullest rank: weights + gradients + AdamW moments +
    the activations held at the step's peak (what ``memory_per_rank`` predicts) + the
    temporaries at that peak (the loss's, FSDP's gathered units:
    :func:`~shardlab.train.report_temporaries.predicted_temporary_bytes`), the figure the
    memory guard holds against this host's free memory before any rank starts."""
    return max(predicted_state_bytes(cfg, p).total
               + held_microbatches(cfg, p) * predicted_activation_bytes(cfg, p)
               + predicted_temporary_bytes(cfg, p) for p in range(cfg.pp))


def comm_table(cfg: Any, ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank and mesh dimension, bytes sent in the measured step (the meter files each
    collective under the dimension whose group ran it) beside the cost model's ring figures for the
    same layout.

    * ``dp``: :func:`~shardlab.train.report_cp.dp_bytes`;
    * ``tp``: torch's DTensor plan (:mod:`shardlab.estimate.comm_dtensor`: one backward
      all-reduce per column-parallel linear, not Megatron's one per block half; a MoE
      layer's MLP sends only for its shared experts, and under full recompute with an
      auxiliary loss re-runs their output all-reduce: :func:`~shardlab.train.report_moe.
      moe_tp_bytes`; experts split over tp: :func:`~shardlab.train.report_moe.
      expert_tp_bytes`);
    * ``pp``: activations forward and gradients back at every chunk boundary, each with
      its micro-batch's int64 padding mask (b x s x 8 bytes) on the way forward, and a
      tied embedding's gradient exchanged between the first and last stage;
    * ``ep`` (mixture of experts): the dispatch and combine all-to-alls, predicted from the
      count matrices the routers produced (:mod:`shardlab.train.report_moe`), measured
      from the real split sizes; ``edp``: FSDP's collectives of the experts over
      expert_dp (:func:`~shardlab.train.report_cp.dp_bytes` of their padded shards) when
      it has more than one rank;
    * ``cp`` (context parallel): the K/V all-gathers and their reduce-scatters in backward
      (:func:`shardlab.estimate.context.cp_bytes_per_stage`); with cp, ``dp`` is FSDP's
      group of dp x cp ranks and tp's and pp's figures are those of the rank's s/cp tokens;
    * ``dp_replicate`` (HSDP): the all-reduce of each rank's gradient shard across the
      replicas (:func:`~shardlab.train.report_cp.replica_bytes`), ``dp`` then being the
      shard group's collectives inside a replica.

    The gradient-norm scalars of clipping (``grad_norm``, 8 bytes each) are listed under
    ``measured`` only.
    """
    policy = get_policy(estimate_dtype(cfg))
    share = cfg.global_batch // cfg.dp
    lay = run_layout(cfg)
    psi = stage_params(cfg.shape, cfg.tp, cfg.pp, cfg.virtual_stages,
                       vocab_parallel=vocab_parallel(cfg),
                       stage_layers=cfg.stage_layers)
    n = shard_ranks(cfg)  # FSDP's shard group: dp x cp (dp/R x cp under HSDP)
    if cfg.shape.moe is None:
        padded = fsdp2_padded_params(cfg.shape, cfg.tp, cfg.pp, n, cfg.virtual_stages,
                                     vocab_parallel=vocab_parallel(cfg),
                                     stage_layers=cfg.stage_layers)
        expert_padded = [0] * cfg.pp
    else:  # FSDP shards the dense parameters over dp, the experts over expert_dp
        padded, expert_padded = map(list, zip(*moe_padded_params(cfg), strict=True))
    groups = ep_groups(cfg, ranks) if cfg.shape.moe is not None else {}
    edp = expert_shard_ranks(cfg) if cfg.ep > 1 else 1
    fp8_gathers = fp8_gathered(cfg, n)
    kept = kept_padded(cfg, n, vocab_parallel(cfg))
    # Each activation travels with its micro-batch's int64 padding mask (b x s x 8 bytes).
    mask = (cfg.micro_batch or share) * cfg.seq * 8
    forward_sends = [sum(1 for c in range(lay.pp * lay.virtual_stages - 1) if c % lay.pp == r)
                     for r in range(lay.pp)]
    # A tied embedding split over the first and last stage: their gradient parts are
    # exchanged once per step (sync_tied_grads; the embedding group's all-reduce on two).
    # Under FSDP each rank exchanges its own rows of it (dim 0 split as torch.chunk does).
    sync = embedding_sync_bytes(cfg.shape, lay, vocab_parallel=False)
    fsdp = cfg.grad_ranks > 1 and cfg.dp_mode != "ddp"
    chunk = -(-cfg.shape.vocab // n)

    def sync_share(position: int) -> float:
        if not fsdp:
            return sync
        return sync * min(chunk, max(0, cfg.shape.vocab - position * chunk)) / cfg.shape.vocab

    ends = [(r == 0) + (r == lay.pp - 1) for r in range(lay.pp)]
    autocast = under_autocast(cfg)
    pp_pred = [b + f * lay.microbatches * mask for b, f in
               zip(pp_bytes_per_rank(cfg.shape, lay, split_by_tp=cfg.sp,
                                     element_bytes=4 if autocast else None),
                   forward_sends, strict=True)]
    tp_pred = [b + u for b, u in zip(
        tp_bytes_dtensor(cfg.shape, local_layout(lay),
                         loss_parallel=loss_split(cfg),
                         fsdp=cfg.grad_ranks > 1 and cfg.dp_mode != "ddp",
                         op_recompute=cfg.recompute == "op",
                         fp8=tp_fp8_linears(cfg.shape, cfg.tp) if cfg.dtype == "fp8"
                         else frozenset(), fp8_gather=cfg.fp8_all_gather,
                         autocast=autocast),
        moe_tp_bytes(cfg, lay), strict=True)]
    cp_pred = cp_bytes_per_stage(cfg.shape, lay, cfg.recompute)
    zero = {"fsdp": 3, "fsdp-zero2": 2, "ddp": 0}[cfg.dp_mode]
    rows = []
    for r in ranks:
        got = r["comm_step"]
        by_dim = got.get("by_dim", {})

        def sent(dim: str, by_dim: dict[str, Any] = by_dim) -> float:
            return float(sum(k["sent_bytes"] for k in by_dim.get(dim, {}).values()))

        row: dict[str, Any] = {"rank": r["rank"], "measured": got}
        if cfg.grad_ranks > 1:
            group = n if zero else cfg.grad_ranks  # DDP all-reduces over all dp x cp ranks
            row["dp"] = {"predicted": dp_bytes(psi[r["pp_rank"]], padded[r["pp_rank"]],
                                                policy, zero, cfg, group,
                                                fp8_gathers[r["pp_rank"]], kept),
                         "measured": sent("dp")}
        if cfg.dp_replicate > 1:
            # (the routed experts' shards are all-reduced across the replicas as well)
            experts = (replica_bytes(cfg, expert_padded[r["pp_rank"]], edp, policy.grad_bytes)
                       if cfg.ep > 1 else 0.0)
            row["dp_replicate"] = {"predicted": replica_bytes(cfg, padded[r["pp_rank"]], n,
                                                              policy.grad_bytes) + experts,
                                   "measured": sent("dp_replicate")}
        if cfg.cp > 1:
            row["cp"] = {"predicted": float(cp_pred[r["pp_rank"]]), "measured": sent("cp")}
        if cfg.ep > 1:
            row["ep"] = {"predicted": predicted_ep_bytes(cfg, run_layout(cfg), r,
                                                         groups[r["rank"]]),
                         "measured": sent("ep")}
        if cfg.ep > 1 and edp > 1:
            row["edp"] = {"predicted": dp_bytes(0, expert_padded[r["pp_rank"]], policy, zero,
                                                 cfg, edp),
                          "measured": sent("edp")}
        if cfg.tp > 1:
            experts_tp = (expert_tp_bytes(cfg, run_layout(cfg), r, groups[r["rank"]])
                          if r["rank"] in groups else 0.0)
            row["tp"] = {"predicted": tp_pred[r["pp_rank"]] + experts_tp,
                         "measured": sent("tp")}
        if cfg.pp > 1:
            row["pp"] = {"predicted": pp_pred[r["pp_rank"]]
                         + (sync_share(shard_position(cfg, r)) if ends[r["pp_rank"]]
                            else 0.0),
                         "measured": sent("pp")}
        rows.append(row)
    return rows


def measured_step_flops(ranks: list[dict[str, Any]]) -> int:
    """FLOPs of one step: the sum of what every rank's
    :class:`~shardlab.distributed.measure.FlopMeter` counted at the local shapes it computed."""
    return sum(n for r in ranks for n in r["flops_by_op"].values())


def early_stop_flops(cfg: Any, tokens: int) -> float:
    """Recompute FLOPs torch's checkpoint skips under full recompute: non-reentrant
    ``checkpoint`` stops re-running a block once the last tensor backward needs is back, so
    each block's MLP output projection (2·d_ff·d per token; a MoE block's shared experts'
    when no auxiliary loss follows them) is not recomputed."""
    if cfg.recompute != "full":
        return 0.0
    m = cfg.shape
    if m.moe is None:
        return m.layers * 2 * m.d_ff * m.d_model * tokens
    # A MoE block's last matmul is its shared experts' output projection (the routed
    # experts' outputs are kept by the gate-weighted combine, so they are recomputed),
    # unless an auxiliary loss is attached after it: its saved input comes later.
    shared = 0 if has_aux(cfg) else m.moe.shared_experts * m.moe.shared_d_ff
    return (m.dense_layers * m.d_ff + m.moe_layers * shared) * 2 * m.d_model * tokens


def replicated_head_flops(cfg: Any, tokens: int) -> float:
    """FLOPs a tied (replicated) head adds when every tensor-parallel rank computes it in full:
    (t - 1) x 6·V·d per token (forward 2·V·d, backward twice that; Kaplan et al. 2020's
    6N rule for the head's V·d weights)."""
    if not cfg.shape.tied or cfg.tp == 1:
        return 0.0
    return (cfg.tp - 1) * 6 * cfg.shape.vocab * cfg.shape.d_model * tokens


def peak_flops(cfg: Any, gpu: str | None, world: int) -> float | None:
    """The job's dense peak FLOP/s for MFU: ``--gpu``'s peak x ranks, or, by default,
    this whole machine as ``shardlab hardware --measure`` stored it (ranks share its
    cores); None when neither is known."""
    dtype = "bf16" if bf16_compute(cfg) else "fp32"
    if gpu is not None:
        acc = accelerator_or_measured(gpu)
        shared = acc.name == "cpu (measured)"
        return acc.peak(dtype) * (1 if shared else world)
    acc = load_measurement()
    return acc.peak(dtype) if acc is not None else None
