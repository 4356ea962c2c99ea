"""A training run's document: measured beside the cost model's prediction for the same
shape and layout (FLOPs, state bytes, communication, activations), and parity with one
process. Built on rank 0's side from what every rank returned."""

from __future__ import annotations

from typing import Any


def report(cfg: Any, ranks: list[dict[str, Any]], reference: list[float] | None,
           log_dir: str, peak: float | None = None) -> dict[str, Any]:
    """Measured beside predicted, and parity with one process."""
    import statistics

    from shardlab.estimate.flops import flops_per_token
    from shardlab.estimate.memory import zero_state_bytes
    from shardlab.estimate.partition import stage_params
    from shardlab.spec.dtypes import get_policy

    r0 = ranks[0]
    losses = r0["losses"]
    tokens = cfg.global_batch * cfg.seq
    step_s = statistics.median(r0["step_seconds"][1:] or r0["step_seconds"])
    fpt = flops_per_token(cfg.shape, cfg.seq, cfg.recompute)
    predicted_flops = fpt.hardware_train * tokens
    measured_flops = measured_step_flops(ranks)
    policy = get_policy("amp-bf16" if cfg.dtype == "bf16" else "fp32")
    zero = 0 if cfg.dp == 1 or cfg.dp_mode == "ddp" else 3
    psi = stage_params(cfg.shape, cfg.tp, cfg.pp, cfg.virtual_stages,
                       vocab_parallel=cfg.tp > 1)
    memory = []
    for r in ranks:
        pred = zero_state_bytes(psi[r["pp_rank"]], policy, zero, cfg.dp)
        memory.append({"rank": r["rank"], "measured": r["state_bytes"],
                       "predicted": {"weights": pred.weights, "gradients": pred.gradients,
                                     "optimizer": pred.optimizer}})
    from shardlab.estimate.activations import (
        first_stage_extra_bytes,
        last_stage_extra_bytes,
        layer_activation_bytes,
    )

    # One micro-batch, shardlab's eager LM (no dropout; the CPU attention kernel is fused).
    e = 2 if cfg.dtype == "bf16" else 4
    mb = cfg.micro_batch or cfg.global_batch // cfg.dp
    kw = {"tp": cfg.tp, "sp": cfg.sp}
    predicted_act = (cfg.shape.layers * layer_activation_bytes(
        cfg.shape, mb, cfg.seq, e, recompute=cfg.recompute, dropout=False, flash=True,
        eager=True, **kw) + first_stage_extra_bytes(cfg.shape, mb, cfg.seq, dropout=False, **kw)
        + last_stage_extra_bytes(cfg.shape, mb, cfg.seq, e, **kw))
    measured_act = r0.get("activation_bytes")
    comm_rows = comm_table(cfg, ranks)
    doc: dict[str, Any] = {
        "model": cfg.shape.describe(),
        "layout": f"dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} {cfg.dp_mode} sp={int(cfg.sp)} "
                  f"recompute={cfg.recompute} schedule={cfg.schedule} dtype={cfg.dtype}",
        "world_size": len(ranks), "steps": cfg.steps, "log_dir": log_dir,
        "losses": losses, "grad_norms": r0["grad_norms"],
        "step_seconds": statistics.median(r0["step_seconds"]),
        "tokens_per_s": tokens / step_s,
        "mfu": fpt.train * tokens / step_s / peak if peak else None,
        "hfu": fpt.hardware_train * tokens / step_s / peak if peak else None,
        "peak_flops": peak,
        "memory_per_rank": memory,
        "comm_bytes_per_step": comm_rows,
        "predicted_vs_measured": {
            "flops_per_step": {"predicted": predicted_flops, "measured": measured_flops,
                               "ratio": measured_flops / predicted_flops},
            "comm_bytes_per_step": comm_rows,
            "activation_bytes_per_microbatch": {
                "predicted": predicted_act if cfg.pp == 1 else None,
                "measured": measured_act,
                "ratio": measured_act / predicted_act if measured_act and cfg.pp == 1
                else None},
        },
    }
    if reference is not None:
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
        tol = 1e-5 if cfg.dtype == "fp32" else 2e-2
        doc.update({"reference_losses": reference, "max_loss_diff": diff,
                    "parity_tolerance": tol, "parity_passed": diff <= tol})
    return doc


def comm_table(cfg: Any, ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank, bytes sent in step 1 by data parallelism and by pipeline sends, measured
    (dispatch-mode meter) beside the cost model's ring figures for the same layout.

    Data parallel: FSDP2 (ZeRO-3: weights gathered for every micro-batch's forward and
    backward, one gradient reduce-scatter) or DDP (one all-reduce of the gradients);
    ``fsdp-zero2`` and tensor parallelism are measured but not compared (torch's TP sends
    one backward all-reduce per column-parallel linear, not Megatron's one per block
    half that ``estimate/comm.py`` counts).
    """
    from shardlab.estimate.comm import dp_bytes_per_step, pp_bytes_per_rank
    from shardlab.estimate.partition import stage_params
    from shardlab.spec.dtypes import get_policy
    from shardlab.spec.layout import make_layout

    policy = get_policy("amp-bf16" if cfg.dtype == "bf16" else "fp32")
    share = cfg.global_batch // cfg.dp
    lay = make_layout(cfg.shape, dp=cfg.dp, tp=cfg.tp, pp=cfg.pp,
                      virtual_stages=cfg.virtual_stages, sp=cfg.sp,
                      micro_batch=cfg.micro_batch or share, global_batch=cfg.global_batch,
                      seq=cfg.seq, dtype=policy.name,
                      schedule=cfg.schedule if cfg.pp > 1 else None)
    psi = stage_params(cfg.shape, cfg.tp, cfg.pp, cfg.virtual_stages,
                       vocab_parallel=cfg.tp > 1 and not cfg.shape.tied)
    # Each activation travels with its micro-batch's int64 padding mask (b x s x 8 bytes).
    mask = (cfg.micro_batch or share) * cfg.seq * 8
    forward_sends = [sum(1 for c in range(lay.pp * lay.virtual_stages - 1) if c % lay.pp == r)
                     for r in range(lay.pp)]
    pp_pred = [b + f * lay.microbatches * mask for b, f in
               zip(pp_bytes_per_rank(cfg.shape, lay, split_by_tp=cfg.sp), forward_sends,
                   strict=True)]
    rows = []
    for r in ranks:
        got = r["comm_step1"]

        def sent(kind: str, got: dict[str, Any] = got) -> float:
            return float(got.get(kind, {}).get("sent_bytes", 0.0))

        row: dict[str, Any] = {"rank": r["rank"], "measured": got}
        if cfg.dp > 1 and cfg.dp_mode in ("fsdp", "ddp"):
            zero = 3 if cfg.dp_mode == "fsdp" else 0
            row["dp"] = {"predicted": dp_bytes_per_step(psi[r["pp_rank"]], policy, zero,
                                                        cfg.dp, cfg.microbatches),
                         "measured": sent("all_gather") + sent("reduce_scatter")
                         if zero else sent("all_reduce")}
        if cfg.pp > 1:
            row["pp"] = {"predicted": pp_pred[r["pp_rank"]], "measured": sent("send")}
        rows.append(row)
    return rows


def measured_step_flops(ranks: list[dict[str, Any]]) -> int:
    """FLOPs of one step over all ranks, from each rank's FlopCounterMode.

    The counter sees a DTensor operation at its global shape, so with tensor
    parallelism every rank of a tensor-parallel group counts the whole matmul: those
    are taken from the group's rank 0 only. The attention kernel runs on each rank's
    own heads as plain tensors and is summed over all ranks.
    """
    total = 0
    for r in ranks:
        for op, n in r["flops_by_op"].items():
            if "scaled_dot_product" in op or r["tp_rank"] == 0:
                total += n
    return total


def peak_flops(cfg: Any, gpu: str | None, world: int) -> float | None:
    """The job's dense peak FLOP/s for MFU: ``--gpu``'s peak x ranks, or, by default,
    this whole machine as ``shardlab hardware --measure`` stored it (ranks share its
    cores); None when neither is known."""
    from shardlab.spec.measure import accelerator_or_measured, load_measurement

    dtype = "bf16" if cfg.dtype == "bf16" else "fp32"
    if gpu is not None:
        acc = accelerator_or_measured(gpu)
        shared = acc.name == "cpu (measured)"
        return acc.peak(dtype) * (1 if shared else world)
    acc = load_measurement()
    return acc.peak(dtype) if acc is not None else None
