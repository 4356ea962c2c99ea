"""The flags of ``shardlab train``, by group (each group is a section of the job file:
layout, run, checkpoints), and ``--config``, added last so every flag is a key."""

from __future__ import annotations

import argparse

from shardlab.cli.args import (
    add_shape_args,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
)
from shardlab.cli.job_file import defer_defaults
from shardlab.config.model import MOE_ROUTINGS
from shardlab.train.config import (
    AUX_COEF,
    DP_MODES,
    PP_SCHEDULES,
    TRAIN_DTYPES,
    TRAIN_RECOMPUTE,
)


def add_train_flags(p: argparse.ArgumentParser) -> None:
    """Every flag of ``shardlab train`` but ``--json`` and ``--config``."""
    add_shape_args(p)
    g = p.add_argument_group("layout")
    g.add_argument("--dp", type=positive_int, default=1)
    g.add_argument("--tp", type=positive_int, default=1)
    g.add_argument("--pp", type=positive_int, default=1)
    g.add_argument("--cp", type=positive_int, default=1,
                   help="context parallel: every sequence split over cp ranks (chunks i and "
                   "2cp-1-i of 2cp), K and V all-gathered in each layer; FSDP over dp x cp")
    g.add_argument("--virtual-stages", type=positive_int, default=1)
    g.add_argument("--stage-layers", metavar="N,N,...",
                   help="layers of each of the pp x virtual-stages pipeline stages, e.g. 3,1 "
                   "(default: the even split)")
    g.add_argument("--dp-replicate", type=positive_int, default=1,
                   help="HSDP: dp = R replicas x dp/R shards (FSDP2 on a 2-D mesh: "
                   "reduce-scatter inside a replica, all-reduce across replicas)")
    g.add_argument("--dp-mode", choices=DP_MODES, default="fsdp",
                   help="fsdp (ZeRO-3), fsdp-zero2 (reshard_after_forward=False) or ddp")
    g.add_argument("--sp", action="store_true", help="sequence parallel (needs tp > 1)")
    g.add_argument("--loss-parallel", action="store_true",
                   help="cross-entropy on the vocabulary-sharded logits (tp > 1)")
    g.add_argument("--recompute", choices=TRAIN_RECOMPUTE, default="none",
                   help="selective: the attention core again (Korthikanti); full: each "
                   "block again; op: torchtitan's per-operator checkpointing (matmul and "
                   "attention outputs kept, every second matmul run again; dense models)")
    g.add_argument("--schedule", choices=PP_SCHEDULES, default="1f1b")
    g.add_argument("--ep", type=positive_int, default=1,
                   help="expert-parallel ranks, drawn from dp (MoE): each holds experts/ep "
                   "of every MoE layer, tokens reach them by all-to-all")
    g.add_argument("--etp", type=positive_int, default=1,
                   help="expert tensor parallel (MoE): 1 keeps experts whole on every tp "
                   "rank, tp splits each expert's width as the dense MLP's")
    g.add_argument("--capacity-factor", type=nonneg_float, default=0.0,
                   help="each expert takes at most ceil(F*tokens*top_k/experts) of a "
                   "micro-batch's tokens per rank, the rest are dropped (0: dropless)")
    g.add_argument("--routing", choices=MOE_ROUTINGS, default="learned",
                   help="MoE routing: learned (the router's top-k) or contiguous (forced "
                   "balance: token t's slot j takes expert (t*k+j) mod E, the router's "
                   "weights at those experts; NeMo AutoModel's FakeBalancedGate, what "
                   "dryrun runs)")
    g = p.add_argument_group("run")
    g.add_argument("--global-batch", type=positive_int, default=8, help="sequences per step")
    g.add_argument("--micro-batch", type=nonneg_int, default=0,
                   help="sequences per micro-batch (0: a data-parallel rank's whole share, "
                   "or with pp > 1 the largest giving the schedule enough micro-batches)")
    g.add_argument("--steps", type=positive_int, default=20)
    g.add_argument("--lr", type=positive_float, default=3e-3)
    g.add_argument("--warmup", type=nonneg_int, default=2)
    g.add_argument("--clip", type=positive_float, default=1.0)
    g.add_argument("--aux-loss-coef", type=nonneg_float, default=AUX_COEF,
                   help="weight of the MoE load-balancing loss (Switch Transformer's 0.01)")
    g.add_argument("--router-z-loss", type=nonneg_float, default=0.0,
                   help="weight of the MoE router z-loss (ST-MoE: 0.001; 0: off)")
    g.add_argument("--dtype", choices=TRAIN_DTYPES, default="fp32",
                   help="fp32; bf16 (fp32 weights and gradients, bf16 compute); fp8: bf16 "
                   "whose attention projections and MLP multiply in fp8 through torchao "
                   "(tensorwise dynamic scaling; head, router, routed experts and norms in "
                   "bf16; torchao's float8 styles under tp); on CUDA GPUs with fp8 tensor "
                   "cores (--fp8-on-cpu: here, to check a run)")
    g.add_argument("--fp8-all-gather", action="store_true",
                   help="with --dtype fp8 and FSDP: gather the fp8 linears' weights in fp8 "
                   "(torchao's enable_fsdp_float8_all_gather), half the bf16 gather's bytes, "
                   "their scales refreshed by one all-reduce after each step")
    g.add_argument("--fp8-on-cpu", action="store_true",
                   help="let --dtype fp8 run torch's CPU fp8 matmul: to check a run's wiring "
                   "and its loss parity on a machine without a GPU, never for speed")
    g.add_argument("--seed", type=nonneg_int, default=0)
    g.add_argument("--data", default="garden",
                   help="garden (built in), a folder `shardlab data prepare` wrote, a text "
                   "file (bytes), or a .bin of token ids")
    g.add_argument("--bin-dtype", choices=("uint16", "uint32"), default="uint16")
    g.add_argument("--nproc", type=positive_int, help="ranks to start (default dp*tp*pp)")
    g.add_argument("--gpu", help="accelerator whose dense peak MFU divides by, per rank "
                   "(default: this CPU as `shardlab hardware --measure` stored it)")
    g.add_argument("--timeout", type=positive_float, default=60.0)
    g.add_argument("--allow-oversubscribe", action="store_true",
                   help="start even when the cost model's memory of the ranks exceeds 90%% "
                   "of what this host has available")
    g.add_argument("--log-dir", help="per-rank logs and train.jsonl (default: a new folder)")
    g.add_argument("--tensorboard", metavar="DIR",
                   help="also write TensorBoard event files here (loss, grad norm, lr, "
                   "tokens/s, MFU per step; memory per rank and bytes per dim at the end): "
                   "tensorboard --logdir DIR")
    g.add_argument("--check-parity", action="store_true",
                   help="also train on one process and compare the loss curves")
    g = p.add_argument_group("checkpoints (docs/guide/checkpoint.md)")
    g.add_argument("--checkpoint-dir", help="write checkpoints under this folder (step-N)")
    g.add_argument("--checkpoint-every", type=nonneg_int, default=0,
                   help="save every K steps (and always after the last; 0: only then)")
    g.add_argument("--keep", type=positive_int, default=3, help="checkpoints kept (newest)")
    g.add_argument("--async-save", action="store_true", default=True,
                   help="write checkpoints in the background while training goes on "
                   "(dcp.async_save; the default, where the CPU copy fits in memory); "
                   "--no-async-save: write them before training goes on")
    g.add_argument("--resume", nargs="?", const="latest", metavar="STEP",
                   help="continue from --checkpoint-dir's latest checkpoint (or STEP's), "
                   "in this run's layout, whatever layout wrote it")
    g.add_argument("--max-restarts", type=nonneg_int, default=0,
                   help="restart a failed job from its last checkpoint up to R times")
    g.add_argument("--init-from", metavar="DIR",
                   help="initial weights from `shardlab import`'s folder (its config.json "
                   "is the model when MODEL is not given)")
    # Fault injection for tests: rank R fails once S steps are done (raise, SIGKILL, or
    # SIGKILL inside the save of step S).
    g.add_argument("--fail-at-step", type=nonneg_int, default=-1, help=argparse.SUPPRESS)
    g.add_argument("--fail-rank", type=nonneg_int, default=-1, help=argparse.SUPPRESS)
    g.add_argument("--fail-how", default="raise", help=argparse.SUPPRESS)
    g.add_argument("--inject-fault", type=int, default=-1, help=argparse.SUPPRESS)


def config_flag(p: argparse.ArgumentParser) -> None:
    """``--config FILE``: every flag above as a key of a TOML file (docs/guide/launch.md);
    a flag on the command line overrides the file, ``--no-FLAG`` turns off its switch.
    Added last, so every flag registered before it is a key."""
    p.add_argument("--config", metavar="FILE", help="a job file (TOML, sections model, "
                   "layout, run, checkpoint, data; `shardlab plan --emit-config` writes "
                   "one): its keys are the flags' names; flags given here override it")
    defer_defaults(p)
