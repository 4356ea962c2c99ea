"""``shardlab plan``: every layout of a model on a cluster, the ones that fit, fastest first."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import asdict, replace
from typing import Any

from shardlab.cli.args import build_shape, shape_flags
from shardlab.cli.budget import apply_cluster_args
from shardlab.cli.job import check_emit_path, emit_config
from shardlab.cli.output import print_json
from shardlab.cli.plan_anchor import anchored
from shardlab.cli.plan_args import SEARCH_DEFAULTS, add_plan_args, check_layout_against_flags
from shardlab.cli.plan_dryrun import dry_run_top
from shardlab.cli.plan_versus import versus
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import FA2_BLACKWELL_SHARE, matmul_peaks
from shardlab.config.layout import SCHEDULES, check_stage_layers, parse_stage_layers
from shardlab.config.measured import accelerator_or_measured, slow_dtype_note
from shardlab.config.model import runtime_builds, with_mtp
from shardlab.config.resolve import load_model
from shardlab.errors import SpecError
from shardlab.nn.garden import garden_vocab
from shardlab.plan.accuracy import plan_accuracy
from shardlab.plan.fit import explain_fit
from shardlab.plan.framework_runs import check_framework_runs, framework_cp, framework_keeps
from shardlab.plan.options import (
    check_trainable,
    megatron_falls_back,
    policy_for,
    step_options_for,
)
from shardlab.plan.overlap import framework as overlap_framework
from shardlab.plan.search import (
    STEP_KEYS,
    given_layout,
    is_this_machine,
    layout_candidates,
    layout_step_keys,
    parse_layout,
    plan,
)
from shardlab.plan.space import TRAIN_SCHEDULES, TRAIN_ZERO, Space
from shardlab.report.plan_view import print_plan


def register(sub: Any) -> None:
    """Add the ``plan`` sub-command."""
    p = sub.add_parser("plan", help="search every layout; rank what fits by step time",
                       description="Search every dp x cp x tp x pp layout (virtual "
                       "stages, schedule, ZeRO, sequence parallel, recompute, micro-batch, "
                       "HSDP, uneven pipeline stages; context parallel when sequences are "
                       "long) of MODEL on N devices, drop what does not fit, rank the rest by "
                       "predicted step time. A search evaluates at most 2,000,000 layouts.")
    add_plan_args(p)
    p.add_argument("--emit-config", metavar="FILE",
                   help="write the winner as a job file for `shardlab train --config FILE` "
                   "and `shardlab launch FILE` (the search then keeps to what train runs)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def model_from_args(args: argparse.Namespace) -> tuple[Any, str]:
    """The model, and how `shardlab train` names it (catalog name, or the shape flags)."""
    shape_flags(args, f"MODEL ({args.model})" if args.model is not None else None)
    mtp = getattr(args, "mtp_layers", 0)  # plan's --mtp-layers; dryrun has none
    if args.model is not None:
        return with_mtp(load_model(args.model), mtp), shlex.quote(args.model)
    vocab = garden_vocab().size
    if args.seq is None:
        args.seq = 32
    shape = with_mtp(build_shape(args, vocab), mtp)
    flags = [f"--style {args.style}", f"--layers {args.layers}", f"--d-model {args.d_model}",
             f"--heads {args.heads}"]
    for flag, value in (("--kv-heads", args.kv_heads), ("--d-ff", args.d_ff),
                        ("--vocab", args.vocab)):
        if value is not None:
            flags.append(f"{flag} {value}")
    if shape.qk_norm:
        flags.append("--qk-norm")
    if shape.moe is not None:  # the experts the plan priced (they were left out until
        # 2026-12-07: the command trained a dense model of the same shape)
        e = shape.moe
        flags += [f"--experts {e.experts}", f"--top-k {e.experts_per_token}",
                  f"--expert-d-ff {e.expert_d_ff}"]
        flags += [f"{flag} {value}" for flag, value in (
            ("--shared-experts", e.shared_experts), ("--dense-layers", e.dense_layers))
            if value]
    return shape, " ".join(flags)


def plan_document(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--json`` document of ``shardlab plan`` (SpecError for bad input)."""
    acc = apply_cluster_args(accelerator_or_measured(args.gpu, args.hardware_file), args)
    model, model_flags = model_from_args(args)
    seq = args.seq or model.context
    here = is_this_machine(acc)
    notes = []
    if here:
        dtype = "fp32" if args.dtype is None else args.dtype
        if dtype == "fp8":
            raise SpecError("dtype", dtype, "fp8 is fast only on CUDA GPUs with fp8 tensor "
                            "cores (torchao float8, Transformer Engine): there is no speed "
                            "of it to plan on this machine's CPU; plan it for a GPU, e.g. "
                            "--gpu h100")
        if dtype not in ("fp32", "bf16"):
            raise SpecError("dtype", dtype, "must be fp32 or bf16 on this machine "
                            "(what shardlab train runs)")
        policy = get_policy("amp-bf16" if dtype == "bf16" else "fp32")
    else:
        dtype = "bf16" if args.dtype is None else args.dtype
        policy = get_policy(dtype)
        matmul_peaks(acc, policy.compute, policy.linear_compute)  # fp8 on an A100: one line
        if policy.is_fp8:
            notes.append("fp8: priced as Transformer Engine and torchao float8 run it (linear "
                         "layers in fp8, attention core (unless flash_kernel=fp8), head and "
                         "router in bf16, fp8 casts at the memory bandwidth); shardlab "
                         "train --dtype fp8 runs it with torchao on CUDA GPUs with fp8 "
                         "tensor cores")
    runnable = here or bool(args.dry_run_top)
    # This machine, or a job file to emit: the winner must be a layout shardlab train runs.
    train_only = here or getattr(args, "emit_config", None) is not None
    # Without --layout, a measured run's step keys describe the stack to search on.
    keys_from = args.layout or ("" if runnable or train_only else args.measured_layout)
    step_keys = layout_step_keys(keys_from)
    if runnable or train_only:
        check_trainable(step_keys)
    measured_policy, policy = policy, policy_for(policy, step_keys)  # optimizer_dtype
    for z in args.zero:
        if z > 3:
            raise SpecError("zero", z, "must be 0, 1, 2 or 3 (3 is FSDP)")
    dense = f"needs a mixture-of-experts model ({model.name} is dense)"
    if model.moe is None and args.ep not in (None, (1,)):
        raise SpecError("ep", ",".join(map(str, args.ep)), dense)
    if model.moe is None and args.capacity_factor:
        raise SpecError("capacity_factor", args.capacity_factor, dense)
    for name in ("ep", "cp", "dp_replicate", "micro_batches"):
        if 0 in (getattr(args, name) or ()):
            raise SpecError(name, 0, "must be a positive integer")
    split = parse_stage_layers(args.stage_layers)
    if split:
        check_stage_layers(model, len(split), split)
    fw = overlap_framework(args.framework)
    # The named framework's pipeline schedules and ZeRO stages only (--schedules or --zero
    # naming another: one line).
    asked = framework_keeps(fw, "schedules", tuple(args.schedules),
                            args.schedules is not SEARCH_DEFAULTS["schedules"])
    schedules = tuple(s for s in asked if not runnable or s in TRAIN_SCHEDULES)
    stages = framework_keeps(fw, "zero", tuple(args.zero),
                             args.zero is not SEARCH_DEFAULTS["zero"])
    space = Space(
        gpus=args.gpus, global_batch=args.global_batch, seq=seq,
        gpus_per_node=args.gpus_per_node or acc.gpus_per_node,
        max_tp=args.max_tp,
        max_pp=args.max_pp, max_virtual=args.max_virtual,
        micro_batches=tuple(sorted(set(args.micro_batches))),
        # This machine, and a plan whose layouts are dry-run: what shardlab train runs.
        zero=tuple(z for z in stages if not runnable or z in TRAIN_ZERO) or (0,),
        recompute=args.recompute,
        schedules=schedules or ("1f1b",),
        train_only=train_only, ep=args.ep, capacity_factor=args.capacity_factor,
        cp=framework_cp(fw, args.cp), dp_replicate=args.dp_replicate, stage_layers=split,
        pipeline_max_zero=fw.pipeline_max_zero,
        # Megatron-Core and torchtitan fold their experts onto a mesh of their own;
        # shardlab train (this machine, or a dry run of the top layouts) draws ep from dp.
        expert_fold=fw.expert_fold and not runnable)
    # A --layout of step-time keys alone sets options for the search.
    given = args.layout and set(parse_layout(args.layout, STEP_KEYS)) - set(step_keys)
    check_layout_against_flags(args, bool(given), step_keys)
    only = layout_candidates(model, space, args.layout) if given else None
    if only is not None:
        check_framework_runs(fw, int(only.pp[0]), SCHEDULES[int(only.schedule[0])],
                             int(only.dp[0]) * int(only.cp[0]), int(only.zero[0]),
                             int(only.cp[0]), int(only.virtual[0]))
    dropout = args.dropout if args.dropout is not None else model.style == "gpt"
    options = step_options_for(acc, flash=args.attention == "flash",
                               overlap_dp=not args.no_overlap_dp, framework=args.framework,
                               overrides=step_keys, model=model)
    if options.flash and megatron_falls_back(model, acc, args.framework, step_keys):
        notes.append(f"attention: Transformer Engine has no cuDNN training kernel for head "
                     f"dim {model.head_dim} on {acc.name} (sm100 trains <= 128, 192/128 and "
                     f"256/256), so it runs FlashAttention-2, priced at "
                     f"{FA2_BLACKWELL_SHARE:.0%} of the dense peak; flash_kernel=fa3 in "
                     f"--layout prices cuDNN's kernel instead")
    acc, anchor = anchored(args, model, acc, space, measured_policy, dropout, notes)
    result = plan(model, acc, space, policy, top=args.top, dropout=dropout, options=options,
                  train_prefix=(f"shardlab train {model_flags}"
                                if here and runtime_builds(model) else None),
                  train_dtype=dtype, only=only, imbalance=args.routing_imbalance)
    fit = None
    if only is not None and not result.best[0]["fits"]:
        layout = given_layout(model, space, args.layout)
        layout = replace(layout, dtype=policy)  # with --layout's optimizer_dtype
        fit = explain_fit(model, layout, acc, capacity=result.device_memory, dropout=dropout,
                          options=options, gpus_per_node=space.gpus_per_node,
                          train_only=train_only, imbalance=args.routing_imbalance,
                          framework=fw if args.framework else None).as_dict()
    vs = None
    if args.versus is not None:
        if only is None:
            raise SpecError("versus", args.versus, "compares with one layout: give --layout "
                            "(a layout: dp, tp, pp, ..., not only step-time keys)")
        vs = versus(args, model, acc, space, measured_policy, dropout, fw, result.best[0],
                    options, policy, runnable or train_only)
    dev = result.device
    fp8 = dev.eff.fp8_curve()
    doc = {
        "model": model.name, "model_shape": model.describe(), "moe": model.moe is not None,
        "gpu": acc.name,
        "gpus": args.gpus, "gpus_per_node": space.gpus_per_node, "seq": seq,
        "global_batch": args.global_batch, "dtype": policy.name,
        "optimizer_dtype": step_keys.get("optimizer_dtype"),
        "optimizer_bytes_per_param": policy.optimizer_bytes,
        "capacity_factor": args.capacity_factor, "routing_imbalance": args.routing_imbalance,
        "peak_flops_per_device": dev.peak, "usable_memory_per_device": result.device_memory,
        "efficiency": {"peak_fraction": dev.eff.peak_fraction,
                       "half_intensity": dev.eff.half_intensity,
                       "op_overhead": dev.eff.op_overhead,
                       "link_fraction": dev.eff.link_fraction,
                       "fp8_peak_fraction": fp8.peak_fraction,
                       "fp8_half_intensity": fp8.half_intensity,
                       "flash_fractions": dict(dev.eff.flash_fractions),
                       "source": dev.eff.source},
        # This machine's measured runtime (gloo's rates per collective, fixed costs per
        # parallel style), or null when it was not measured (or is not this machine).
        "runtime": asdict(dev.runtime) if dev.runtime is not None else None,
        "this_machine": here, "layout_given": args.layout,
        "linear_peak_flops_per_device": dev.linear_peak or dev.peak,
        "inter_node_link": asdict(acc.inter_link), "power_watts": acc.power_watts,
        "gpu_source": acc.source,
        # The step-time options priced: the framework's defaults, then --layout's keys.
        "framework": None if args.framework is None else fw.name,
        "expert_fold": space.expert_fold,
        # What the named framework runs, which the search and --layout keep to (null: any;
        # the search may keep to less: --schedules, --zero, shardlab train's rules).
        "framework_runs": None if args.framework is None else {
            "schedules": fw.schedules, "zero": fw.zero,
            "context_parallel": fw.context_parallel,
            "pipeline_max_zero": fw.pipeline_max_zero},
        "step_options": {**asdict(options), "framework_source": fw.source},
        "step_keys_from": (step_keys or None) and ("--layout" if args.layout
                                                   else "--measured-layout"),
        # A dtype with no fast kernel on this measured CPU: priced at its measured slow rate.
        "notes": notes + result.notes + [n for n in (slow_dtype_note(acc, dtype),) if n],
        "candidates_evaluated": result.candidates_evaluated, "feasible": result.feasible,
        "rejected": result.rejected, "seconds": result.seconds,
        "smallest_memory_per_device": result.smallest_memory, "best": result.best,
        # --layout that does not fit: what binds and the changes that make it fit.
        "fit": fit, "anchor": anchor,  # --measured-step: the curve fitted to it
        "versus": vs,  # --versus: a second layout priced beside --layout's
        # Held-out error of published runs like the winner (no correction: a statement).
        "accuracy": None if here or not result.best else plan_accuracy(
            acc.name, policy.linear_compute, acc.efficiency is not None,
            args.framework and fw.name, model.moe is not None, args.gpus, result.best[0],
            model.moe.experts if model.moe else 0, model.mla is not None),
    }
    if args.dry_run_top:
        dry_run_top(doc, model, args.dry_run_top, acc.memory_bytes)
    return doc


def run(args: argparse.Namespace) -> int:
    """Plan and print (tables, or one JSON document with --json); with --emit-config,
    write the winner's job file (its path checked before the search)."""
    emit = check_emit_path(args.emit_config)
    doc = plan_document(args)
    line = None
    if emit is not None:
        line = emit_config(emit, doc, model_from_args(args)[1])
    if args.json:
        print_json(doc)
    else:
        print_plan(doc)
    if line is not None:
        (sys.stderr if args.json else sys.stdout).write(line + "\n")
    return 0
