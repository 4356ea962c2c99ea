"""``shardlab dryrun``: the real sharded program of one rank (or every role) of an N-rank
job, run on fake tensors in this process, beside the cost model's figures."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any

from shardlab.cli.args import add_shape_args, positive_int
from shardlab.cli.output import print_json
from shardlab.cli.plan import model_from_args
from shardlab.config.layout import make_layout, parse_stage_layers
from shardlab.config.limits import MAX_GPUS
from shardlab.dryrun.compare import check_dry_runnable, role_ranks
from shardlab.errors import SpecError, require_int_at_most, require_positive_int
from shardlab.plan.search import layout_flag, layout_sp, parse_layout
from shardlab.plan.space import DP_MODE_OF_ZERO
from shardlab.report.dryrun_view import print_dryrun
from shardlab.train.config import (
    TrainConfig,
    auto_micro_batch,
    check_config,
    estimate_dtype,
    layout_recompute,
    require_torchao,
)
from shardlab.train.report_cp import layout_keys


def register(sub: Any) -> None:
    """Add the ``dryrun`` sub-command."""
    p = sub.add_parser("dryrun", help="the real sharded program of any rank, on fake tensors",
                       description="Run rank R of an N-rank training job (the program "
                       "`shardlab train` runs: FSDP2/DDP, TP, PP, recompute, AdamW) in this "
                       "process on fake tensors and torch's fake process group: no memory "
                       "is allocated. Prints its peak memory by category, bytes per mesh "
                       "dim and FLOPs beside the cost model's figures. A mixture of experts "
                       "runs expert parallel with contiguous (forced-balanced) routing.")
    p.add_argument("model", nargs="?", help="catalog name or path to a Hugging Face "
                   "config.json (default: a small model from the shape flags)")
    p.add_argument("--gpus", type=positive_int, required=True, help="ranks of the job")
    p.add_argument("--layout", default="",
                   help='"dp=.. tp=.. pp=.. virtual=.. zero=2|3 sp=0|1 '
                   'recompute=none|selective|full|op loss_parallel=0|1 schedule=.. '
                   'micro_batch=.. cp=.. '
                   'stage_layers=3+1 dp_replicate=.. ep=.. etp=1|(the tp degree) '
                   'capacity_factor=.. routing=contiguous" (dp defaults to gpus/(cp*tp*pp), '
                   "zero to 3: FSDP; a mixture of experts routes contiguously, train's "
                   "--routing contiguous)")
    p.add_argument("--cp", type=positive_int,
                   help="context parallel: every sequence split over cp ranks (the layout's "
                   "cp=N)")
    p.add_argument("--stage-layers", metavar="N,N,...",
                   help="layers of each pipeline stage, e.g. 3,1 (the layout's "
                   "stage_layers=3+1; default: the even split)")
    p.add_argument("--dp-replicate", type=positive_int,
                   help="HSDP: dp = R replicas x dp/R shards (the layout's dp_replicate=R)")
    p.add_argument("--global-batch", type=positive_int,
                   help="sequences per optimizer step (default: dp x the pipeline's "
                   "micro-batches)")
    p.add_argument("--dtype", choices=("bf16", "fp32", "fp8"), default="bf16",
                   help="bf16 (default: FSDP2's bf16 parameters with fp32 reduction, or "
                   "autocast), fp32, or fp8 (train's: torchao's float8 linears over bf16, "
                   "on fake tensors, so no fp8 GPU is needed)")
    p.add_argument("--fp8-all-gather", action="store_true",
                   help="with --dtype fp8 and FSDP: FSDP gathers the fp8 linears' weights in "
                   "fp8 (train's --fp8-all-gather: torchao's fp8 all-gather, the scales "
                   "refreshed by one all-reduce after each step)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--rank", type=int, help="the rank to run (default 0)")
    who.add_argument("--all-roles", action="store_true",
                     help="one rank per distinct role (each pipeline rank); busiest first")
    p.add_argument("--gpu", help="a device to judge the fit on (e.g. h100): its memory "
                   "against the peak plus the CUDA context's allowance")
    p.add_argument("--jobs", type=positive_int,
                   help="roles dry-run at once, each in its own process (default: one per "
                   "core)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    add_shape_args(p)
    # --seq (a shape-flag group member): MODEL's context when not given.
    p.set_defaults(run=run, seq=None)


def _int(raw: dict[str, str], key: str, default: int) -> int:
    try:
        return int(raw.get(key, default))
    except ValueError:
        raise SpecError(key, raw[key], "must be an integer") from None


def _moe_keys(raw: dict[str, str], moe: bool) -> tuple[int, int, float, str]:
    """The layout's ``ep``, ``etp``, ``capacity_factor`` and ``routing`` (train checks them
    against the model). A MoE layer routes contiguously here (nn.moe_contiguous): a fake
    tensor has no values for a learned router, or a random draw, to pick experts by."""
    text = raw.get("capacity_factor", "0")
    try:
        capacity = float(text)
    except ValueError:
        raise SpecError("capacity_factor", text, "must be a number >= 0") from None
    routing = raw.get("routing", "contiguous" if moe else "learned")
    if moe and routing != "contiguous":
        raise SpecError("routing", routing, "must be contiguous in a dry run: its fake tensors "
                        "carry no values for a router or a random draw to pick experts by "
                        "(`shardlab train --routing learned` runs the router)")
    return _int(raw, "ep", 1), _int(raw, "etp", 1), capacity, routing


def _flags_into_layout(args: argparse.Namespace, raw: dict[str, str]) -> dict[str, str]:
    """``--layout``'s keys with ``--cp``, ``--stage-layers`` and ``--dp-replicate`` added;
    SpecError when a flag and a key both give one."""
    for key, value in (("cp", args.cp), ("stage_layers", args.stage_layers),
                       ("dp_replicate", args.dp_replicate)):
        if value is None:
            continue
        if key in raw:
            raise SpecError(key, value, f"is given twice: by --{key.replace('_', '-')} and "
                            f"by --layout's {key}={raw[key]}")
        raw[key] = str(value)
    return raw


def config_from(args: argparse.Namespace) -> TrainConfig:
    """The run ``train`` would make of MODEL, ``--gpus`` and ``--layout``, checked with
    train's own one-line errors (SpecError), before any model is built."""
    given_seq = args.seq
    shape, _ = model_from_args(args)
    require_int_at_most("gpus", args.gpus, MAX_GPUS)
    raw = _flags_into_layout(args, parse_layout(args.layout, ("loss_parallel", "routing")))
    ep, etp, capacity, routing = _moe_keys(raw, shape.moe is not None)
    tp, pp, virtual = _int(raw, "tp", 1), _int(raw, "pp", 1), _int(raw, "virtual", 1)
    cp, replicas = _int(raw, "cp", 1), _int(raw, "dp_replicate", 1)
    for key, value in (("tp", tp), ("pp", pp), ("cp", cp)):
        require_positive_int(key, value)  # before gpus is divided by them
    if args.gpus % (cp * tp * pp):
        what = f"tp*pp ({tp * pp})" if cp == 1 else f"cp*tp*pp ({cp * tp * pp})"
        raise SpecError("gpus", args.gpus, f"must be a multiple of {what}")
    dp = _int(raw, "dp", args.gpus // (cp * tp * pp))
    if dp * cp * tp * pp != args.gpus:
        what = f"dp*tp*pp ({dp}*{tp}*{pp})" if cp == 1 else f"dp*cp*tp*pp ({dp}*{cp}*{tp}*{pp})"
        raise SpecError("gpus", args.gpus, f"must equal {what}")
    zero = _int(raw, "zero", 3)
    if zero not in DP_MODE_OF_ZERO:
        raise SpecError("zero", zero, "must be 0 (ddp), 2 (fsdp-zero2) or 3 (fsdp): what "
                        "shardlab train runs")
    sp = layout_sp(raw)
    schedule = raw.get("schedule", "interleaved-1f1b" if virtual > 1 else "1f1b")
    seq = given_seq or shape.context
    if seq > shape.context:
        raise SpecError("seq", seq, f"must be <= the model's context ({shape.context})")
    micro = _int(raw, "micro_batch", 0)
    global_batch = args.global_batch or dp * (micro or 1) * pp
    if pp > 1 and not micro:
        micro = auto_micro_batch(global_batch, dp, pp, schedule)
    cfg = TrainConfig(shape=shape, dp=dp, tp=tp, pp=pp, virtual_stages=virtual, cp=cp,
                      stage_layers=parse_stage_layers(raw.get("stage_layers")),
                      dp_replicate=replicas,
                      dp_mode=DP_MODE_OF_ZERO[zero] if dp * cp > 1 else "fsdp", sp=sp,
                      loss_parallel=layout_flag("loss_parallel", raw.get("loss_parallel", "0")),
                      recompute=raw.get("recompute", "none"), schedule=schedule,
                      global_batch=global_batch, micro_batch=micro, seq=seq, steps=2,
                      dtype=args.dtype, fp8_all_gather=args.fp8_all_gather, ep=ep, etp=etp,
                      capacity_factor=capacity, routing=routing)
    check_config(cfg)
    check_dry_runnable(cfg)
    require_torchao(cfg)
    return cfg


def fit_advice(cfg: TrainConfig, acc: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """What binds in the dry run (its largest category at the peak) and the cost model's
    cheapest changes that make the layout fit (:func:`shardlab.plan.fit.explain_fit`, what
    ``train`` runs only), against the device's memory less the CUDA context's
    allowance."""
    # Imported here: the planner's fit advice is needed only for a layout that does not fit.
    from shardlab.plan.fit import explain_fit
    from shardlab.plan.options import step_options_for
    zero = ({mode: z for z, mode in DP_MODE_OF_ZERO.items()}[cfg.dp_mode]
            if cfg.grad_ranks > 1 else 0)
    layout = make_layout(cfg.shape, gpus=cfg.world, dp=cfg.dp, tp=cfg.tp, pp=cfg.pp,
                         virtual_stages=cfg.virtual_stages, zero=zero, sp=cfg.sp, cp=cfg.cp,
                         stage_layers=cfg.stage_layers, dp_replicate=cfg.dp_replicate,
                         micro_batch=cfg.micro_batch or cfg.global_batch // cfg.dp,
                         global_batch=cfg.global_batch, seq=cfg.seq,
                         recompute=layout_recompute(cfg.recompute),
                         dtype=estimate_dtype(cfg),
                         schedule=cfg.schedule if cfg.pp > 1 else None, ep=cfg.ep,
                         etp=cfg.etp, capacity_factor=cfg.capacity_factor)
    # The changes keep train's per-operator checkpointing (None: the planner's default).
    options = (replace(step_options_for(acc, flash=True), selective="op")
               if cfg.recompute == "op" else None)
    advice = explain_fit(cfg.shape, layout, acc,
                         capacity=doc["fit"]["capacity_bytes"] - doc["fit"]["allowance_bytes"],
                         options=options, train_only=True).as_dict()
    by = doc["by_category"]
    advice["dry_run_binding"] = max(by, key=lambda k: by[k])
    return advice


def dryrun_document(args: argparse.Namespace) -> dict[str, Any]:
    """Check everything, dry-run the rank or roles, and return the comparison document
    (SpecError for bad input, before anything runs; RoleError when a role fails)."""
    cfg = config_from(args)
    capacity, acc = None, None
    if args.gpu is not None:
        # Imported here: the hardware catalog is read only when a verdict is asked for.
        from shardlab.config.measured import accelerator_or_measured
        acc = accelerator_or_measured(args.gpu)
        capacity = acc.memory_bytes
    if args.rank is not None and not 0 <= args.rank < cfg.world:
        raise SpecError("rank", args.rank, f"must be in [0, {cfg.world}) for {cfg.world} ranks")
    # Imported here: torch loads only once the command line is known to be good.
    from shardlab.dryrun.compare import compare
    from shardlab.dryrun.pool import run_roles
    start = time.perf_counter()
    ranks = role_ranks(cfg) if args.all_roles else [args.rank or 0]
    results = run_roles(cfg, ranks, args.jobs)
    doc = compare(cfg, results, capacity)
    if acc is not None and not doc["fit"]["fits"]:
        doc["fit_advice"] = fit_advice(cfg, acc, doc)
    return {"model": cfg.shape.describe(), "gpus": cfg.world,
            "layout": f"dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} virtual={cfg.virtual_stages} "
                      f"{cfg.dp_mode} sp={int(cfg.sp)} recompute={cfg.recompute} "
                      f"schedule={cfg.schedule} micro_batch={cfg.micro_batch or 'all'} "
                      f"global_batch={cfg.global_batch} seq={cfg.seq} dtype={cfg.dtype}"
                      f"{moe_keys(cfg)}{layout_keys(cfg)}",
            "gpu": args.gpu, "seconds": time.perf_counter() - start,
            "roles_run": ranks,
            "host_peak_rss_bytes": max(r["host_peak_rss_bytes"] for r in results), **doc}


def moe_keys(cfg: TrainConfig) -> str:
    """The layout line's expert keys for a mixture of experts (empty for a dense model)."""
    if cfg.shape.moe is None:
        return ""
    return (f" ep={cfg.ep} etp={cfg.etp}"
            + (f" capacity_factor={cfg.capacity_factor:g}" if cfg.capacity_factor else ""))


def run(args: argparse.Namespace) -> int:
    """Dry-run and print (tables, or one JSON document with --json); a role that fails
    is one line naming its rank, exit code 1."""
    # Imported here: the pool (and torch) loads only once the command line is good.
    from shardlab.dryrun.pool import RoleError
    try:
        doc = dryrun_document(args)
    except RoleError as e:
        sys.stderr.write(f"shardlab dryrun: {e}\n")
        return 1
    if args.json:
        print_json(doc)
    else:
        print_dryrun(doc)
    return 0
