"""A training job as a file: train's flags read from one (``shardlab launch``), a plan's
winner written to one (``shardlab plan --emit-config``), the layout checked either way
before anything is written.

The job file's format is :mod:`shardlab.cli.job_file`'s; this module holds what needs
train's own parser (:func:`train_args`) and the checks train makes of a run that do not
need its data or this host (:func:`layout_config`): a script for a cluster, or a file
written on a laptop for a cluster, is refused here rather than when the job starts.
"""

from __future__ import annotations

import argparse
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shardlab import __version__
from shardlab.cli import train
from shardlab.cli.args import Parser, build_shape, shape_flags
from shardlab.cli.job_file import apply_job_file, job_text
from shardlab.config.files import check_output, write_atomic
from shardlab.config.layout import parse_stage_layers
from shardlab.config.measured import accelerator_or_measured
from shardlab.errors import SpecError
from shardlab.nn.garden import garden_vocab
from shardlab.plan.search import train_command, trains_by_op
from shardlab.train.config import TrainConfig, auto_micro_batch, check_config


def train_args(argv: list[str]) -> argparse.Namespace:
    """``shardlab train ARGV``'s namespace, every flag filled (the file's, then the
    defaults), before train's own checks: what a job file is read into or written from."""
    parser = Parser(prog="shardlab")
    train.register(parser.add_subparsers(dest="command", parser_class=Parser))
    args = parser.parse_args(["train", *argv])
    apply_job_file(args)
    return args


def layout_config(args: argparse.Namespace) -> TrainConfig:
    """The job's :class:`TrainConfig` as far as it is known without its data and away from
    the host that will run it, checked as ``shardlab train`` checks it (the layout, the
    micro-batch, the accelerator's name); SpecError naming the key otherwise. The model's
    vocabulary stands in for the corpus's: the garden's, unless the file sets ``vocab``."""
    ns = argparse.Namespace(**vars(args))
    if ns.model is None and ns.init_from is not None:
        ns.model = str(Path(ns.init_from) / "config.json")
    shape_flags(ns, f"[model] name ({ns.model})" if ns.model is not None else None)
    shape = build_shape(ns, ns.vocab or garden_vocab().size)
    if ns.seq > shape.context and shape.style == "gpt":
        raise SpecError("seq", ns.seq, f"must be <= context ({shape.context})")
    micro = ns.micro_batch
    if micro == 0 and ns.pp > 1:
        micro = auto_micro_batch(ns.global_batch, ns.dp, ns.pp, ns.schedule)
    cfg = TrainConfig(shape=shape, dp=ns.dp, tp=ns.tp, pp=ns.pp, ep=ns.ep, etp=ns.etp,
                      cp=ns.cp, stage_layers=parse_stage_layers(ns.stage_layers),
                      dp_replicate=ns.dp_replicate,
                      capacity_factor=ns.capacity_factor, routing=ns.routing,
                      aux_coef=ns.aux_loss_coef,
                      z_coef=ns.router_z_loss,
                      virtual_stages=ns.virtual_stages, dp_mode=ns.dp_mode, sp=ns.sp,
                      loss_parallel=ns.loss_parallel, recompute=ns.recompute,
                      schedule=ns.schedule, global_batch=ns.global_batch, micro_batch=micro,
                      seq=ns.seq, steps=ns.steps, lr=ns.lr, warmup=ns.warmup, clip=ns.clip,
                      dtype=ns.dtype, fp8_all_gather=ns.fp8_all_gather, seed=ns.seed)
    check_config(cfg)
    if ns.gpu is not None:
        accelerator_or_measured(ns.gpu)  # a name train would refuse, refused here
    return cfg


def read_job(path: str) -> tuple[argparse.Namespace, TrainConfig]:
    """A job file's flags and its checked layout (:func:`layout_config`)."""
    args = train_args(["--config", path])
    return args, layout_config(args)


def winner_argv(doc: dict[str, Any], model_flags: str) -> list[str]:
    """``shardlab train``'s flags for a plan's winner (``doc`` is the plan's document):
    the plan's own train command on this machine; elsewhere the same flags and the
    accelerator (``--gpu``) that MFU divides by. SpecError when no winner fits."""
    best = doc["best"][0] if doc["best"] else None
    if best is None or not best["fits"]:
        raise SpecError("emit_config", "winner", "the plan has no layout that fits; nothing "
                        "written")
    if doc["dtype"] not in ("fp32", "bf16", "amp-bf16", "fp8"):
        raise SpecError("dtype", doc["dtype"], "shardlab train runs fp32, bf16 (autocast) "
                        "or fp8 (torchao); plan with one of them to emit a job file")
    dtype = doc["dtype"] if doc["dtype"] in ("fp32", "fp8") else "bf16"
    by_op = trains_by_op(doc.get("step_options", {}).get("selective"), doc["moe"])
    command = best["train_command"] or train_command(
        f"shardlab train {model_flags}", best, doc["global_batch"], doc["seq"], dtype, by_op)
    argv = shlex.split(command)[2:]
    return argv if doc["this_machine"] else [*argv, "--gpu", doc["gpu"]]


def emit_config(path: Path, doc: dict[str, Any], model_flags: str) -> str:
    """Write the winner's job file to ``path`` (whole, then renamed into place) once it has
    passed train's checks (:func:`layout_config`); return the line that says so."""
    args = train_args(winner_argv(doc, model_flags))
    cfg = layout_config(args)
    best = doc["best"][0]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = [f"shardlab {__version__} job file, written by `shardlab plan --emit-config` on "
              f"{when}: the winner for {doc['model_shape']} on {doc['gpus']} x {doc['gpu']}",
              f"({doc['global_batch']} sequences of {doc['seq']} tokens per step, "
              f"{best['step_seconds']:.4g} s per step predicted)",
              "run: shardlab train --config FILE (flags given there override these keys); "
              "on a cluster: shardlab launch FILE --nodes N --gpus-per-node G --emit slurm",
              "keys: the train flags' names with _ for - (--global-batch is global_batch); "
              "--no-FLAG turns off a switch set here"]
    write_atomic(path, job_text(args, header).encode())
    ep = f" ep={cfg.ep}" if cfg.ep > 1 else ""
    ep += f" cp={cfg.cp}" if cfg.cp > 1 else ""
    return (f"wrote {path}: dp={cfg.dp} tp={cfg.tp} pp={cfg.pp}{ep} ({cfg.world} ranks), "
            f"{cfg.global_batch} sequences of {cfg.seq} tokens per step")


def check_emit_path(path: str | None) -> Path | None:
    """``--emit-config``'s path, checked writable before the search (or None)."""
    return check_output(path, "emit_config") if path is not None else None
