"""The flags of ``shardlab plan`` (``shardlab report plan`` and ``shardlab demo`` reuse
them), and the check that ``--layout`` and a flag do not disagree."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from shardlab.cli.args import (
    add_shape_args,
    nonneg_float,
    positive_int,
    positive_int_at_most,
)
from shardlab.cli.budget import MTP_HELP, add_cluster_args, imbalance_arg, mtp_layers_arg
from shardlab.cli.plan_anchor import add_anchor_args
from shardlab.config.layout import RECOMPUTE, SCHEDULES
from shardlab.errors import SpecError

SEARCH_DEFAULTS: dict[str, Any] = {
    "max_tp": None, "max_pp": None, "max_virtual": 8, "micro_batches": (1, 2, 4, 8),
    "zero": (0, 1, 2, 3), "recompute": RECOMPUTE, "schedules": SCHEDULES, "ep": None,
    "cp": None, "dp_replicate": None}
"""The search flags' defaults: a --layout of one layout takes none of the others."""

MAX_TOP = 1000
"""The most layouts ``--top`` shows: 1,000 rows already take seconds to draw (a hundred
thousand ran past a minute), and no one reads past them."""


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be integers, e.g. 1,2,4") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be integers >= 0, e.g. 1,2,4")
    return values


def _names(allowed: tuple[str, ...]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(x for x in text.replace(",", " ").split())
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"{text!r}: each must be one of "
                                             f"{', '.join(allowed)}")
        return values
    return parse


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """Every flag of ``shardlab plan`` except --json (``shardlab report plan`` reuses them)."""

    p.add_argument("model", nargs="?", help="catalog name or config.json (default: a small "
                   "model from the shape flags, as `shardlab train` builds it)")
    add_shape_args(p)
    p.set_defaults(seq=None)  # --seq: the model's context unless given (32 for a flags model)
    g = p.add_argument_group("cluster")
    g.add_argument("--gpu", default="H100 SXM", help="accelerator name (loose match; `cpu` is "
                   "this machine as `shardlab hardware --measure` stored it)")
    g.add_argument("--gpus", type=positive_int, required=True,
                   help="devices in the job, at most 2^20 (1,048,576)")
    g.add_argument("--gpus-per-node", type=positive_int,
                   help="devices per node (default: the accelerator's, 8 for GPUs)")
    g.add_argument("--hardware-file", type=Path, help="TOML file of extra accelerators/links")
    add_cluster_args(p)
    add_anchor_args(p.add_argument_group("your measurement"))
    g = p.add_argument_group("job")
    g.add_argument("--global-batch", type=positive_int, required=True,
                   help="sequences per optimizer step, at most 2^24")
    g.add_argument("--dtype", help="dtype policy (default bf16; fp32 on this machine, where "
                   "bf16 means torch autocast as `shardlab train --dtype bf16`); fp8: the "
                   "linear layers multiply in fp8 at the accelerator's fp8 peak, attention "
                   "core, head and router in bf16 (Transformer Engine, torchao float8; needs "
                   "an accelerator with an fp8 peak: H100, H200, B200, GB200, MI300X; "
                   "shardlab train runs it on CUDA GPUs only)")
    g.add_argument("--framework", help="megatron, torchtitan, fsdp or deepspeed: price the "
                   "step as that framework runs it by default (which communication overlaps "
                   "compute, fused norms, fused gradient accumulation; see --layout's overlap "
                   "keys, which override it) and, for megatron and torchtitan, its memory at "
                   "its peak (the loss's working set, one layer's recompute, FSDP's unsharded "
                   "layers, Megatron's fp32 gradients, torchtitan's per-op checkpointing: "
                   "docs/validation.md); the search keeps to the pipeline schedules, ZeRO "
                   "stages and context parallelism it runs (megatron: 1f1b, "
                   "interleaved-1f1b; deepspeed: 1f1b at ZeRO 0-1, no cp; torchtitan, fsdp: "
                   "no zb-h2, no ZeRO-1); default: data-parallel overlap only, memory as "
                   "states and saved activations, every layout")
    g.add_argument("--attention", choices=("flash", "eager"), default="flash",
                   help="flash (default, as budget and today's real runs): a fused kernel "
                   "keeps only softmax statistics; eager: the s x s scores are kept "
                   "(Korthikanti et al. 2022's counts)")
    g.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=None,
                   help="dropout masks in activation memory (default: gpt yes, llama no)")
    g.add_argument("--no-overlap-dp", action="store_true",
                   help="data-parallel communication does not overlap compute")
    g.add_argument("--capacity-factor", type=nonneg_float, default=0.0,
                   help="MoE capacity factor of the job: each expert takes at most "
                   "ceil(F*tokens*top_k/experts) tokens of each rank; 0 (default) is dropless")
    g.add_argument("--mtp-layers", type=mtp_layers_arg, default=0, metavar="N",
                   help=MTP_HELP)
    g.add_argument("--routing-imbalance", type=imbalance_arg, default=1.0,
                   help="MoE: max/mean tokens per expert the router produces; routed "
                   "activations are sized for it (default 1.0: balanced)")
    g = p.add_argument_group("search")
    g.add_argument("--top", type=positive_int_at_most(MAX_TOP), default=5,
                   help=f"layouts to show (at most {MAX_TOP:,})")
    g.add_argument("--max-tp", type=positive_int, help="largest tp (default: devices per node)")
    g.add_argument("--max-pp", type=positive_int, help="largest pp (default: the layers)")
    g.add_argument("--max-virtual", type=positive_int, default=SEARCH_DEFAULTS["max_virtual"],
                   help="most model chunks per pipeline rank (at most 4,096)")
    g.add_argument("--micro-batches", type=_int_list, default=SEARCH_DEFAULTS["micro_batches"],
                   help="micro-batch sizes to try (sequences), e.g. 1,2,4,8")
    g.add_argument("--zero", type=_int_list, default=SEARCH_DEFAULTS["zero"],
                   help="ZeRO stages to try")
    g.add_argument("--recompute", type=_names(RECOMPUTE), default=SEARCH_DEFAULTS["recompute"],
                   help="recompute modes to try, e.g. none,selective")
    g.add_argument("--schedules", type=_names(SCHEDULES), default=SEARCH_DEFAULTS["schedules"],
                   help=f"pipeline schedules to try ({', '.join(SCHEDULES)})")
    g.add_argument("--ep", type=_int_list,
                   help="expert-parallel degrees to try (MoE), e.g. 1,8 (default: every "
                   "divisor of dp that divides the experts; etp is searched over 1 and tp)")
    g.add_argument("--cp", type=_int_list,
                   help="context-parallel degrees to try, e.g. 1,2,4,8 (default: every one "
                   "that cuts seq into 2*cp equal chunks of a rank's at least 4,096 tokens "
                   "of it)")
    g.add_argument("--dp-replicate", type=_int_list,
                   help="HSDP replica counts to try, e.g. 1,4 (default: 1 and the one that "
                   "keeps each ZeRO shard group within a node; needs ZeRO >= 1)")
    g.add_argument("--stage-layers", metavar="N,N,...",
                   help="layers of each pipeline stage, in order (searches only the "
                   "pp x virtual stages that make that many stages); default: the even "
                   "split and the first and last stage 1 or 2 layers fewer")
    g.add_argument("--dry-run-top", type=positive_int, metavar="K",
                   help="dry-run the K fastest layouts that fit (every role of each, the "
                   "program `shardlab train` runs, on fake tensors: minutes at scale), mark "
                   "those whose real peak exceeds the device, and re-rank; the search then "
                   "keeps to what train runs (ZeRO 0/2/3; gpipe, 1f1b, interleaved-1f1b)")
    g.add_argument("--versus", metavar="LAYOUT",
                   help="with --layout: price this second layout (its own step-time keys) "
                   "beside it, their step-time ratio, and how far off the planner's ratio has "
                   "been on published pairs of the same kind of change (docs/validation.md)")
    g.add_argument("--layout", help='evaluate one layout instead of searching, e.g. "dp=1 '
                   'tp=8 pp=8 virtual=3 micro_batch=1 zero=1 sp=1 recompute=selective '
                   'schedule=1f1b", MoE: ep=8 etp=1 capacity_factor=1.25, context '
                   'parallel cp=2, uneven stages stage_layers=7+9, HSDP dp_replicate=4 '
                   '(keys left out take their defaults; each key once; sp is 0 or 1). '
                   'Step-time keys, 0 or '
                   '1, override --framework: overlap_dp (gradient reduce-scatter/all-reduce '
                   'and parameter all-gather per bucket or layer behind backward/forward), '
                   'overlap_tp (tensor-parallel collectives split alongside their matmuls: '
                   "Megatron's --tp-comm-overlap, torch async TP), overlap_pp (pipeline "
                   "sends/receives behind the next chunk's compute, the warmup's and "
                   "flush's too; Megatron's default overlaps only interleaved schedules' "
                   "steady phase), overlap_ep (MoE "
                   "all-to-alls beside another micro-batch's compute: Megatron's "
                   "--overlap-moe-expert-parallel-comm), fused_norm (RMSNorm in "
                   'one kernel, else eager torch), fused_accumulation (the weight-gradient '
                   "matmul adds into the held gradient, else a separate pass per micro-batch: "
                   "Megatron's --no-gradient-accumulation-fusion is 0), fp8_params (with --dtype "
                   "fp8: linear weights kept in fp8 with their transpose, no bf16 copy, and "
                   "gathered in fp8: Megatron's --fp8-param-gather); "
                   'flash_kernel=fa2|fa3|triton|fa1|fp8 (fp8: a fused attention in fp8, '
                   "Transformer Engine's --fp8-dot-product-attention, with --dtype fp8) and "
                   'reduce_dtype=bf16|fp32 name the attention kernel and FSDP gradient '
                   'reduction a run used, backward_prefetch=pre|post when ZeRO-3 gathers '
                   "in backward (FSDP1's BackwardPrefetch: post, Composer's default, leaves "
                   'those gathers unhidden), optimizer_dtype=fp32|bf16_moments|bf16 its Adam '
                   'state (12, 8 or 4 bytes per parameter: fp32 master and moments; '
                   'bf16 moments beside the fp32 master; bf16 moments and no master), '
                   'recompute_modules=core_attn+layernorm+moe_act+moe+mlp+mla_up_proj what '
                   "recompute=selective runs again (Megatron's --recompute-modules), "
                   'offload_layers=N the layers per rank whose activations go to host '
                   "memory (Megatron's --cpu-offloading-num-layers; pp 1, no recompute), "
                   'fused_loss=1 a fused cross-entropy, fp8_recipe=delayed|tensorwise|mxfp8 '
                   "the Transformer Engine fp8 recipe (with --dtype fp8: its casts' bytes), "
                   'dispatcher=alltoall|flex and routing=random|contiguous its MoE token '
                   'dispatcher; a --layout of only these keys searches '
                   'with them')


def check_layout_against_flags(args: argparse.Namespace, one_layout: bool,
                               step_keys: dict[str, str]) -> None:
    """SpecError where --layout and a flag disagree, instead of one silently winning: a
    search flag beside one layout, ``overlap_dp`` beside --no-overlap-dp, a fused
    kernel named with eager attention."""
    if one_layout:
        for name, default in SEARCH_DEFAULTS.items():
            value = getattr(args, name)
            if value != default:
                shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
                raise SpecError(name, shown, "searches layouts, and --layout prices one: give "
                                "it in --layout or leave it out")
    if args.no_overlap_dp and "overlap_dp" in step_keys:
        raise SpecError("overlap_dp", step_keys["overlap_dp"], "is given by --layout and by "
                        "--no-overlap-dp: give one")
    if args.attention == "eager" and "flash_kernel" in step_keys:
        raise SpecError("flash_kernel", step_keys["flash_kernel"], "names a fused attention "
                        "kernel, and --attention eager keeps the s x s scores: give one")
