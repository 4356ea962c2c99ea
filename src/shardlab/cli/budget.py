"""``shardlab budget``: what it takes to train (and serve) a model, on a layout and a device."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from shardlab.cli.args import (
    nonneg_float,
    nonneg_int,
    number_in,
    param_count,
    positive_float,
    positive_int,
    positive_int_at_most,
)
from shardlab.cli.output import print_json
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import Accelerator, matmul_peaks, power_capped, with_nics
from shardlab.config.layout import RECOMPUTE, SCHEDULES, Layout, make_layout, parse_stage_layers
from shardlab.config.limits import MAX_CONTEXT, MAX_GPUS
from shardlab.config.measured import NAME, accelerator_or_measured
from shardlab.config.model import ModelShape, with_mtp
from shardlab.config.resolve import load_model
from shardlab.errors import SpecError, require_int_at_most
from shardlab.estimate.budget import Assumptions, model_budget, params_budget
from shardlab.plan.fit import explain_fit, layout_memory
from shardlab.plan.framework_runs import check_framework_runs
from shardlab.plan.options import step_options_for
from shardlab.plan.overlap import framework as overlap_framework
from shardlab.report.budget_view import print_budget


def add_layout_args(p: argparse.ArgumentParser) -> None:
    """The layout flags shared by every command that takes a layout."""
    g = p.add_argument_group("layout")
    g.add_argument("--dp", type=positive_int, help="data-parallel degree (default gpus/(tp*pp))")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree")
    g.add_argument("--pp", type=positive_int, default=1, help="pipeline stages")
    g.add_argument("--virtual-stages", type=positive_int, default=1,
                   help="model chunks per pipeline rank (interleaved, zb-v, dualpipev)")
    g.add_argument("--zero", type=nonneg_int, default=0, help="ZeRO stage 0-3 (3 = FSDP)")
    g.add_argument("--sp", action="store_true", help="sequence parallel (needs tp > 1)")
    g.add_argument("--micro-batch", type=positive_int, default=1, help="sequences per micro-batch")
    g.add_argument("--global-batch", type=positive_int,
                   help="sequences per optimizer step (default dp*micro_batch*pp)")
    g.add_argument("--seq", type=positive_int, help="sequence length (default: model context)")
    g.add_argument("--recompute", choices=RECOMPUTE, default="none",
                   help="activation recompute")
    g.add_argument("--dtype", default="bf16",
                   help="dtype policy: bf16 fp16 amp-bf16 bf16-pure fp32 fp8 (fp8: bf16 mixed "
                   "precision with the linear layers in fp8, as Transformer Engine and "
                   "torchao run it; needs an accelerator with an fp8 peak: H100, H200, B200, "
                   "GB200, MI300X; shardlab train runs it on CUDA GPUs only)")
    g.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule (default 1f1b)")
    g.add_argument("--ep", type=positive_int, default=1,
                   help="expert-parallel degree (MoE): ranks of the dp group that split the "
                   "routed experts; must divide dp and the experts")
    g.add_argument("--etp", type=positive_int,
                   help="expert tensor parallel (MoE): 1 keeps experts whole on each tp rank, "
                   "tp (default) splits each expert's width like the dense MLP")
    g.add_argument("--capacity-factor", type=nonneg_float, default=0.0,
                   help="MoE capacity factor: each expert takes at most ceil(F*tokens*top_k/"
                   "experts) tokens of each rank and drops the rest; 0 (default) is dropless")
    g.add_argument("--cp", type=positive_int, default=1,
                   help="context-parallel degree (its own mesh dim: devices = dp*cp*tp*pp): "
                   "each sequence is cut into 2*cp chunks, rank i holding chunks i and "
                   "2cp-1-i; K and V are all-gathered per layer (Llama 3); must split seq "
                   "into 2*cp equal chunks")
    g.add_argument("--stage-layers", metavar="N,N,...",
                   help="layers of each pipeline stage (pp x virtual-stages counts, in order, "
                   "each >= 1, summing to the layers), e.g. 7,8,8,7; default: the even split")
    g.add_argument("--dp-replicate", type=positive_int, default=1,
                   help="HSDP: dp = R replicas x dp/R shards (ZeRO/FSDP inside each replica, "
                   "gradients all-reduced across replicas); must divide dp, needs --zero >= 1")


def add_hardware_args(p: argparse.ArgumentParser) -> None:
    """--gpu, --gpus and --hardware-file."""
    g = p.add_argument_group("hardware")
    g.add_argument("--gpu", default="H100 SXM", help="accelerator name (loose match; "
                   "`shardlab hardware` lists them; `cpu` is this machine as measured by "
                   "`shardlab hardware --measure`)")
    g.add_argument("--gpus", type=positive_int,
                   help="devices in the job, at most 2^20 (default dp*tp*pp)")
    g.add_argument("--hardware-file", type=Path, help="TOML file of extra accelerators/links")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """Facts of the cluster a run states (``budget`` and ``plan``): the nodes' NICs and
    their speed, and a GPU power cap (:func:`apply_cluster_args`)."""
    g = p.add_argument_group("cluster facts (what a run states; default: the catalog's)")
    g.add_argument("--nics-per-node", type=positive_int,
                   help="network cards per node, shared by its devices (default: one per "
                   "device)")
    g.add_argument("--nic-gbps", type=positive_float,
                   help="speed of each NIC in Gb/s (default: the accelerator's inter-node "
                   "link, e.g. 400 for IB NDR); 4 x 100 Gb/s gives each of 8 GPUs 6.25 GB/s")
    g.add_argument("--power-cap-w", type=positive_float,
                   help="GPU power limit in W (nvidia-smi -pl): matmul peaks scale by "
                   "(cap/board power)^(1/3), the clock a capped GPU keeps (assumption: "
                   "power ~ clock^3); memory and links unchanged")


def apply_cluster_args(acc: Accelerator, args: argparse.Namespace) -> Accelerator:
    """``acc`` with the cluster facts of :func:`add_cluster_args` applied (SpecError on
    this machine, whose links and clock are measured, not stated)."""
    nics, gbps, cap = args.nics_per_node, args.nic_gbps, args.power_cap_w
    given = [n for n, v in (("nics_per_node", nics), ("nic_gbps", gbps),
                            ("power_cap_w", cap)) if v is not None]
    if given and acc.name == NAME:
        raise SpecError(given[0], getattr(args, given[0]), "states a GPU cluster's fact; "
                        "this machine's links and clock are measured (`shardlab hardware "
                        "--measure`)")
    if nics is not None or gbps is not None:
        acc = with_nics(acc, nics, gbps)
    return acc if cap is None else power_capped(acc, cap)


def register(sub: Any) -> None:
    """Add the ``budget`` sub-command."""
    p = sub.add_parser("budget", help="parameters, FLOPs, memory, time, money, comm, inference",
                       description="What it takes to train and serve MODEL on a layout.")
    p.add_argument("model", nargs="?", help="catalog name or path to a Hugging Face config.json")
    p.add_argument("--params", type=param_count,
                   help="a bare parameter count instead of MODEL (states, 6ND, time, DP "
                   "comm): 1 to 2^53, e.g. 7.5e9 or 7B (suffixes K, M, B, T)")
    add_layout_args(p)
    add_hardware_args(p)
    add_cluster_args(p)
    add_assumption_args(p)
    p.add_argument("--framework", help="megatron or torchtitan (fsdp, deepspeed: no memory "
                   "facts): also give the memory per device at that framework's peak, as "
                   "`shardlab plan --layout ... --framework` counts it (its loss's working "
                   "set, one layer's recompute, FSDP's unsharded layers, Megatron's fp32 "
                   "gradients, torchtitan's per-operator checkpointing); needs a MODEL")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def add_assumption_args(p: argparse.ArgumentParser) -> None:
    """What the budget takes as given (MFU, tokens, price, attention kernel, decoding)."""
    g = p.add_argument_group("assumptions")
    g.add_argument("--tokens", type=number_in(1.0, 1e18),
                   help="training tokens, at most 1e18 (default 20 x params)")
    g.add_argument("--mfu", type=number_in(1e-4, 1.0), default=0.4,
                   help="model FLOPs utilisation, 0.0001 to 1 (and an HFU of at most 1)")
    g.add_argument("--price-per-gpu-hour", type=number_in(0.0, 1e6), default=2.0,
                   help="USD per device-hour, 0 to 1e6 (assumption, default 2.0)")
    g.add_argument("--causal", action="store_true",
                   help="count causal attention at half the s x s FLOPs")
    g.add_argument("--attention", choices=("flash", "eager"), default="flash",
                   help="flash (default, as plan and today's real runs): a fused kernel keeps "
                   "only softmax statistics and recomputes Q·Kᵀ in backward; eager keeps the "
                   "s x s scores (Korthikanti et al. 2022's counts)")
    g.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=None,
                   help="dropout masks in activation memory (default: gpt yes, llama no)")
    g.add_argument("--decode-batch", type=positive_int, default=1, help="sequences decoded at once")
    g.add_argument("--decode-context", type=positive_int_at_most(MAX_CONTEXT),
                   help="tokens of context per decoded sequence, at most 2^24 (default: "
                   "model context)")
    g.add_argument("--mtp-layers", type=mtp_layers_arg, default=0, metavar="N",
                   help=MTP_HELP)
    g.add_argument("--routing-imbalance", type=imbalance_arg, default=1.0,
                   help="MoE: max/mean tokens per expert the router produces (a run's "
                   "routing_imbalance); routed activations are sized for it (default 1.0: "
                   "balanced)")


MTP_HELP = ("train with N multi-token-prediction depths (DeepSeek-V3; Megatron's "
            "--mtp-num-layers): N layers of the model's last kind appended, each with its "
            "projection and one more pass through the head (a --stage-layers split counts "
            "them); priced only, 0 to 16 (default 0)")


def mtp_layers_arg(text: str) -> int:
    """Multi-token-prediction depths: an integer from 0 to 16 (DeepSeek-V3 uses 1)."""
    value = nonneg_int(text)
    if value > 16:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most 16 (prediction depths)")
    return value


def imbalance_arg(text: str) -> float:
    """A routing imbalance: max/mean expert load, a finite number >= 1."""
    value = positive_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1 (max/mean expert load)")
    return value


def assumptions_from(args: argparse.Namespace) -> Any:
    """The :class:`~shardlab.estimate.budget.Assumptions` the flags of
    :func:`add_assumption_args` give."""

    return Assumptions(mfu=args.mfu, tokens=args.tokens,
                       price_per_gpu_hour=args.price_per_gpu_hour, causal=args.causal,
                       attention=args.attention, dropout=args.dropout,
                       decode_batch=args.decode_batch, decode_context=args.decode_context,
                       routing_imbalance=args.routing_imbalance)


def model_and_layout(args: argparse.Namespace) -> tuple[Any, Any]:
    """MODEL and the layout the flags of :func:`add_layout_args` give (SpecError if bad)."""

    model = with_mtp(load_model(args.model), args.mtp_layers)
    split = parse_stage_layers(args.stage_layers)
    layout = make_layout(model, gpus=args.gpus, dp=args.dp, tp=args.tp, pp=args.pp,
                         virtual_stages=args.virtual_stages, zero=args.zero, sp=args.sp,
                         micro_batch=args.micro_batch, global_batch=args.global_batch,
                         seq=args.seq, recompute=args.recompute, dtype=args.dtype,
                         schedule=args.schedule, ep=args.ep, etp=args.etp,
                         capacity_factor=args.capacity_factor, cp=args.cp,
                         stage_layers=split, dp_replicate=args.dp_replicate)
    return model, layout


def fit_advice(model: ModelShape, layout: Layout, acc: Accelerator, a: Assumptions,
               doc: dict[str, Any], framework: str | None = None) -> dict[str, Any] | None:
    """The budget's ``fit`` object: None when the layout fits, else what binds and the
    changes that make it fit (:func:`shardlab.plan.fit.explain_fit`), held to the same
    capacity as the budget's verdict and with the budget's activation conventions; with
    ``framework``, only changes to layouts it runs."""
    if doc["memory"]["fits"]:
        return None
    options = step_options_for(acc, flash=a.attention == "flash")
    return explain_fit(model, layout, acc, capacity=doc["memory"]["capacity"],
                       dropout=doc["assumptions"]["dropout"], options=options,
                       imbalance=a.routing_imbalance,
                       framework=overlap_framework(framework) if framework else None
                       ).as_dict()


def framework_memory(model: ModelShape, layout: Layout, acc: Accelerator, a: Assumptions,
                     doc: dict[str, Any], name: str) -> dict[str, Any]:
    """The budget's ``memory.framework`` object: the busiest device's bytes as the planner
    counts them with framework ``name``'s memory facts (:func:`shardlab.plan.fit.
    layout_memory`; ``transient``: what it holds at its peak beyond states and saved
    activations), their total and whether that fits the budget's capacity."""
    fw = overlap_framework(name)
    options = step_options_for(acc, flash=a.attention == "flash", framework=fw.name,
                               model=model)
    # Megatron-Core and torchtitan fold the experts over tp x cp x dp, as plan prices them.
    mem = layout_memory(model, replace(layout, expert_fold=fw.expert_fold), options,
                        dropout=doc["assumptions"]["dropout"], imbalance=a.routing_imbalance)
    facts = options.memory
    return {"name": fw.name, "per_device": mem, "fits": mem["total"] <= doc["memory"]["capacity"],
            "source": facts.source if facts is not None else "no memory facts: states and "
            "saved activations only"}


def run(args: argparse.Namespace) -> int:
    """Compute the budget and print it (tables, or one JSON document with --json)."""

    if (args.model is None) == (args.params is None):
        raise SpecError("model", args.model, "give a MODEL or --params N, not both or neither")
    acc = apply_cluster_args(accelerator_or_measured(args.gpu, args.hardware_file), args)
    a = assumptions_from(args)
    policy = get_policy(args.dtype)
    if policy.is_fp8 and acc.name == NAME:
        raise SpecError("dtype", args.dtype, "fp8 is fast only on CUDA GPUs with fp8 tensor "
                        "cores (torchao float8, Transformer Engine): this machine's CPU has "
                        "no fp8 speed to budget (train --fp8-on-cpu only checks a run)")
    matmul_peaks(acc, policy.compute, policy.linear_compute)  # fp8 on an A100: one line
    if args.framework is not None:
        overlap_framework(args.framework)  # an unknown name: one line listing the known ones
    if args.params is not None:
        if args.framework is not None:
            raise SpecError("framework", args.framework, "needs a MODEL: a framework's peak "
                            "is of its layers' activations and its logits")
        for name, value, default in (("ep", args.ep, 1), ("etp", args.etp, None),
                                     ("capacity_factor", args.capacity_factor, 0.0)):
            if value != default:
                raise SpecError(name, value, "needs a MODEL: a bare parameter count has no "
                                "experts")
        for name, value, default in (("cp", args.cp, 1), ("stage_layers", args.stage_layers,
                                                          None),
                                     ("dp_replicate", args.dp_replicate, 1),
                                     ("mtp_layers", args.mtp_layers, 0)):
            if value != default:
                raise SpecError(name, value, "needs a MODEL: a bare parameter count has no "
                                "layers or sequence to split")
        for name, value in (("gpus", args.gpus), ("dp", args.dp), ("tp", args.tp),
                            ("pp", args.pp)):
            if value is not None:
                require_int_at_most(name, value, MAX_GPUS)
        gpus = args.gpus or (args.dp or 1) * args.tp * args.pp
        require_int_at_most("gpus", gpus, MAX_GPUS)
        if args.dp is not None and args.dp * args.tp * args.pp != gpus:
            raise SpecError("gpus", gpus, f"must equal dp*tp*pp ({args.dp}*{args.tp}*{args.pp})")
        if gpus % (args.tp * args.pp):
            raise SpecError("gpus", gpus, f"must be a multiple of tp*pp ({args.tp * args.pp})")
        if args.zero > 3:
            raise SpecError("zero", args.zero, "must be 0, 1, 2 or 3 (3 is FSDP)")
        doc = params_budget(args.params, acc, gpus=gpus, tp=args.tp, pp=args.pp, zero=args.zero,
                            policy=get_policy(args.dtype), a=a)
        doc["fit"] = None  # a bare count has no activations and no step-time model to try
    else:
        model, layout = model_and_layout(args)
        if args.framework is not None:
            check_framework_runs(overlap_framework(args.framework), layout.pp, layout.schedule,
                                 layout.dp * layout.cp, layout.zero, layout.cp,
                                 layout.virtual_stages)
        doc = model_budget(model, layout, acc, a)
        doc["fit"] = fit_advice(model, layout, acc, a, doc, args.framework)
        if args.framework is not None:
            doc["memory"]["framework"] = framework_memory(model, layout, acc, a, doc,
                                                          args.framework)
    if args.json:
        print_json(doc)
    else:
        print_budget(doc)
    return 0
