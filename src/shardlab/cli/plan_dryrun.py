"""``shardlab plan --dry-run-top K``: the planner's K fastest layouts, each dry-run (every
role, on fake tensors), marked where the real program's peak exceeds the device, and
re-ranked: layouts whose dry run does not fit move below those that do."""

from __future__ import annotations

from typing import Any

from shardlab.config.model import ModelShape
from shardlab.dryrun.compare import check_dry_runnable, role_ranks
from shardlab.errors import SpecError
from shardlab.plan.search import train_recompute, trains_by_op, trains_fp8_gathers
from shardlab.plan.space import DP_MODE_OF_ZERO, TRAIN_SCHEDULES
from shardlab.train.config import TrainConfig, check_config, require_torchao


def train_config(model: ModelShape, entry: dict[str, Any], global_batch: int, seq: int,
                 dtype: str, by_op: bool = False) -> TrainConfig:
    """The run ``shardlab train`` would make of a plan entry; SpecError (naming why) for
    a layout it does not run (ZeRO-1, a zero-bubble schedule, DDP with tp or pp). An fp8
    plan dry-runs train's fp8 program (torchao's float8 linears, gathered
    in fp8 under ZeRO-3 as the plan prices them: :func:`trains_fp8_gathers`); every
    other 16-bit policy, train's bf16. ``by_op``
    (:func:`~shardlab.plan.search.trains_by_op`): a selective entry dry-runs train's
    per-operator checkpointing, ``recompute=op``. A mixture of experts routes contiguously
    (train's ``--routing contiguous``): fake tensors have no values for a router to read."""
    if entry["dp"] > 1 and entry["zero"] not in DP_MODE_OF_ZERO:
        raise SpecError("zero", entry["zero"], "is not run by shardlab train (0, 2 or 3)")
    if entry["pp"] > 1 and entry["schedule"] not in TRAIN_SCHEDULES:
        raise SpecError("schedule", entry["schedule"], "is not run by shardlab train "
                        f"({', '.join(TRAIN_SCHEDULES)})")
    cfg = TrainConfig(shape=model, dp=entry["dp"], tp=entry["tp"], pp=entry["pp"],
                      virtual_stages=entry["virtual_stages"],
                      dp_mode="fsdp" if entry["dp"] == 1 else DP_MODE_OF_ZERO[entry["zero"]],
                      sp=bool(entry["sp"]),
                      recompute=train_recompute(entry["recompute"], by_op),
                      schedule=entry["schedule"] if entry["pp"] > 1 else "1f1b",
                      global_batch=global_batch, micro_batch=entry["micro_batch"], seq=seq,
                      steps=2, dtype=dtype if dtype in ("fp32", "fp8") else "bf16",
                      ep=entry.get("ep", 1),
                      etp=entry.get("etp", 1) if model.moe is not None else 1,
                      capacity_factor=entry.get("capacity_factor", 0.0),
                      routing="contiguous" if model.moe is not None else "learned",
                      cp=entry.get("cp", 1), dp_replicate=entry.get("dp_replicate", 1),
                      stage_layers=tuple(entry.get("stage_layers") or ()),
                      fp8_all_gather=trains_fp8_gathers(entry, dtype))
    check_config(cfg)
    require_torchao(cfg)
    return cfg


def dry_run_top(doc: dict[str, Any], model: ModelShape, k: int, capacity: float,
                jobs: int | None = None) -> None:
    """Dry-run the first ``k`` layouts of ``doc["best"]`` that the cost model says fit, add
    each one's ``dry_run`` record, and move those whose dry-run peak (plus the CUDA
    context's allowance) exceeds ``capacity`` below the rest, keeping the planner's order
    otherwise. In place."""
    # Imported here: torch (the dry run's workers) loads only when a dry run is asked for.
    from shardlab.dryrun.compare import CUDA_CONTEXT_BYTES, compare
    from shardlab.dryrun.pool import run_many

    chosen, work = [], []
    by_op = trains_by_op(doc.get("step_options", {}).get("selective"), doc["moe"])
    for entry in doc["best"]:
        if len(chosen) == k:
            break
        if not entry["fits"]:
            continue
        try:
            cfg = train_config(model, entry, doc["global_batch"], doc["seq"], doc["dtype"],
                               by_op)
            check_dry_runnable(cfg)
        except SpecError as e:
            entry["dry_run"] = {"skipped": str(e)}
            continue
        chosen.append((entry, cfg))
        work += [(cfg, rank) for rank in role_ranks(cfg)]
    results = run_many(work, jobs) if work else []
    at = 0
    for entry, cfg in chosen:
        roles = results[at:at + cfg.pp]
        at += cfg.pp
        cmp = compare(cfg, roles, capacity)
        entry["dry_run"] = {"rank": cmp["busiest_rank"], "peak_bytes": cmp["peak_bytes"],
                            "predicted_peak_bytes": cmp["predicted"]["peak_bytes"],
                            "allowance_bytes": CUDA_CONTEXT_BYTES,
                            "fits": cmp["fit"]["fits"],
                            "headroom_bytes": cmp["fit"]["headroom_bytes"],
                            "ratio": cmp["ratio"],
                            "seconds": sum(r["seconds"] for r in roles)}
    # Stable: the planner's order, with dry runs that do not fit moved to the end.
    doc["best"].sort(key=lambda e: e.get("dry_run", {}).get("fits") is False)
    doc["dry_run_top"] = k
    imbalance = doc.get("routing_imbalance") or 1.0
    if model.moe is not None and chosen and imbalance != 1.0:
        # The dry run routes contiguously (balanced); the plan priced a busier expert rank.
        doc["notes"].append(f"dry runs route contiguously (every expert T*k/E rows): the "
                            f"plan's --routing-imbalance {imbalance:g} is in its figures, not "
                            "in the dry-run peaks")
