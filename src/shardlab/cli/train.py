"""``shardlab train``: real training on a (pp, dp, cp, tp) device mesh, with the cost model
beside."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from shardlab.cli.args import (
    build_shape,
    shape_flags,
)
from shardlab.cli.guard import check_memory
from shardlab.cli.job_file import apply_job_file
from shardlab.cli.output import print_json
from shardlab.cli.train_flags import add_train_flags, config_flag
from shardlab.config.layout import parse_stage_layers
from shardlab.config.measured import NAMES, load_measurement, slow_dtype_note
from shardlab.errors import SpecError
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.report.train_view import print_moe, print_train
from shardlab.train.config import (
    TrainConfig,
    auto_micro_batch,
    check_config,
)
from shardlab.train.folders import check_folder, make_folder, new_log_folder
from shardlab.train.lock import checkpoint_lock
from shardlab.train.report import peak_flops, predicted_peak_bytes, report


def register(sub: Any) -> None:
    """Add the ``train`` sub-command."""
    p = sub.add_parser("train", help="real training on a device mesh (FSDP2/HSDP/DDP, TP, "
                       "PP, CP, EP)",
                       description="Train shardlab's LM on dp x cp x tp x pp real processes and "
                       "print the cost model's prediction beside what the run measured.")
    p.add_argument("model", nargs="?", help="catalog name or config.json (default: a small "
                   "model from the shape flags)")
    add_train_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)
    config_flag(p)


def load_documents(args: argparse.Namespace) -> tuple[int, list[list[int]]]:
    """(vocabulary size, documents) of the chosen corpus; SpecError if a file is bad."""
    if args.data == "garden":
        return garden_vocab().size, garden_documents(2000, args.seed)
    path = Path(args.data)
    if path.is_dir():  # `shardlab data prepare`'s folder, checked whole before any rank
        # Imported here: the reader of a prepared folder is for this case alone.
        from shardlab.data.manifest import read_prepared

        return read_prepared(path, doc_tokens=args.seq + 1)
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.nn.data import bin_documents, bin_vocab, byte_documents

    if path.suffix == ".bin":
        docs = bin_documents(path, args.bin_dtype, doc_tokens=args.seq + 1)
        return bin_vocab(docs, path, args.bin_dtype), docs
    return byte_documents(path, doc_tokens=args.seq + 1)


def under_torchrun() -> bool:
    """:func:`shardlab.distributed.launch.under_torchrun`'s test, without importing torch."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def check(args: argparse.Namespace) -> tuple[TrainConfig, float | None, list[str]]:
    """The run's TrainConfig, the peak MFU divides by and the notes to print, every check
    done before any rank starts and nothing written. A model too big for this host is
    refused before torch is imported (0.5 s from the command's start here)."""
    apply_job_file(args)  # --config's keys, then the defaults, where the line gave no flag
    _shape_flags(args)
    init = _init_folder(args)
    vocab, docs = load_documents(args)
    if args.model is None and init is not None:
        args.model = str(init / "config.json")
    shape = build_shape(args, vocab)
    if args.seq > shape.context and shape.style == "gpt":
        raise SpecError("seq", args.seq, f"must be <= context ({shape.context})")
    if len(docs) < args.global_batch:
        raise SpecError("data", args.data, f"has {len(docs)} documents; a step needs "
                        f"{args.global_batch}")
    fail_at, fail_rank = args.fail_at_step, args.fail_rank
    if args.inject_fault >= 0:  # the older test flag: raise at step 2
        fail_at, fail_rank = 2, args.inject_fault
    # Under torchrun, --max-restarts is torchrun's: a restarted worker resumes by itself.
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) if under_torchrun() else 0
    notes, micro = [], args.micro_batch
    if micro == 0 and args.pp > 1:
        micro = auto_micro_batch(args.global_batch, args.dp, args.pp, args.schedule)
        notes.append(f"--micro-batch 0 with pp={args.pp} ({args.schedule}): {micro} "
                     f"sequences per micro-batch, {args.global_batch // args.dp // micro} "
                     "micro-batches per step")
    cfg = TrainConfig(shape=shape, dp=args.dp, tp=args.tp, pp=args.pp, ep=args.ep,
                      cp=args.cp, stage_layers=parse_stage_layers(args.stage_layers),
                      dp_replicate=args.dp_replicate,
                      etp=args.etp, capacity_factor=args.capacity_factor,
                      routing=args.routing, aux_coef=args.aux_loss_coef, z_coef=args.router_z_loss,
                      virtual_stages=args.virtual_stages, dp_mode=args.dp_mode, sp=args.sp,
                      loss_parallel=args.loss_parallel, recompute=args.recompute,
                      schedule=args.schedule, global_batch=args.global_batch,
                      micro_batch=micro, seq=args.seq, steps=args.steps, lr=args.lr,
                      warmup=args.warmup, clip=args.clip, dtype=args.dtype,
                      fp8_all_gather=args.fp8_all_gather, seed=args.seed,
                      log_dir=args.log_dir or "", fail_at_step=fail_at, fail_rank=fail_rank,
                      fail_how=args.fail_how, attempt=attempt,
                      checkpoint_dir=args.checkpoint_dir or "",
                      checkpoint_every=args.checkpoint_every, keep=args.keep,
                      async_save=args.async_save,
                      init_from=str(init) if init is not None else "", docs=docs)
    check_config(cfg)
    if args.check_parity and cfg.cp > 1 and cfg.shape.moe is not None:
        _check_cp_parity(cfg)
    if args.fp8_on_cpu and cfg.dtype != "fp8":
        raise SpecError("fp8_on_cpu", True, f"needs --dtype fp8, not {cfg.dtype}")
    if cfg.fp8_all_gather and args.checkpoint_dir and args.async_save:
        notes.append("--fp8-all-gather: checkpoints are saved in step, not in the background "
                     "(torch's async save mis-stages torchao's fp8 weights)")
    if cfg.dtype == "fp8":
        # Imported here: it loads torch, which a run refused above never needs.
        from shardlab.train.fp8 import fp8_on_gpu, fp8_refusal

        why = fp8_refusal(args.fp8_on_cpu)
        if why is not None:
            raise SpecError("dtype", "fp8", why)
        if not fp8_on_gpu() and cfg.sp and cfg.tp > 1:
            raise SpecError("sp", True, "with --dtype fp8 and tp > 1 runs on CUDA/NCCL only: "
                            "torchao all-gathers the sequence in fp8, which gloo cannot send "
                            "(leave --sp off on this machine; dryrun runs it)")
        if args.fp8_on_cpu and not fp8_on_gpu():
            notes.append("--dtype fp8 on the CPU: torch's CPU fp8 matmul checks the run's "
                         "wiring and loss; its speed says nothing of a GPU's")
    world = cfg.world
    peak = peak_flops(cfg, args.gpu, world)  # a bad --gpu fails here, before any rank
    cfg = dataclasses.replace(cfg, tensorboard=args.tensorboard or "", peak_flops=peak or 0.0)
    if args.nproc is not None and args.nproc != world and not under_torchrun():
        raise SpecError("nproc", args.nproc, f"must equal dp*cp*tp*pp ({world})")
    check_folder("log_dir", args.log_dir)
    check_folder("tensorboard", args.tensorboard)
    check_folder("checkpoint_dir", args.checkpoint_dir)
    _check_memory(cfg, args)
    if args.checkpoint_dir or args.resume is not None:
        # Imported here: they load torch, which the torch-free commands (budget, plan) must
        # not, and which a run refused above never needs.
        from shardlab.distributed.checkpoint_manifest import data_fingerprint
        from shardlab.train.resume import resume_folder

        if args.checkpoint_dir:
            cfg = dataclasses.replace(cfg, data_id=data_fingerprint(docs))
        cfg = dataclasses.replace(cfg, resume_from=resume_folder(cfg, args.resume))
    return cfg, peak, notes


def _check_cp_parity(cfg: TrainConfig) -> None:
    """A MoE under cp routes each cp rank's s/cp tokens of every sequence (the load-balancing
    loss sums its counts over the cp ranks, so learned dropless routing is one process's). A
    capacity drops among one call's tokens, and contiguous routing cycles through them, in
    their order: one process running whole sequences would route otherwise, so no parity
    with it is claimed for those."""
    if cfg.capacity_factor:
        raise SpecError("capacity_factor", cfg.capacity_factor, "with --cp drops among each "
                        "cp rank's own s/cp tokens, which one process does not reproduce: "
                        "leave out --check-parity or --capacity-factor")
    if cfg.routing != "learned":
        raise SpecError("routing", cfg.routing, "with --cp cycles through each cp rank's own "
                        "tokens, which one process does not reproduce: leave out "
                        "--check-parity or use learned routing")


def prepare(args: argparse.Namespace) -> tuple[Any, float | None]:
    """:func:`check`, then the log and checkpoint folders made: what ``run`` launches (and
    the tests, several runs at once)."""
    cfg, peak, _ = check(args)
    if cfg.checkpoint_dir:
        make_folder("checkpoint_dir", cfg.checkpoint_dir)
    return make_log_folder(cfg), peak


def make_log_folder(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its log folder made (a new one under the temporary folder by default)."""
    if cfg.tensorboard:
        make_folder("tensorboard", cfg.tensorboard)
    if not cfg.log_dir:
        return dataclasses.replace(cfg, log_dir=new_log_folder())
    make_folder("log_dir", cfg.log_dir)
    return cfg


def dtype_note(dtype: str, gpu: str | None) -> str | None:
    """The line that says ``dtype`` is slow on this machine (an emulated matmul kernel, as
    ``shardlab hardware --measure`` found), or None (fast, another --gpu, or unmeasured)."""

    if gpu is not None and gpu.strip().lower() not in NAMES:
        return None
    acc = load_measurement()
    return slow_dtype_note(acc, dtype) if acc is not None else None


def run(args: argparse.Namespace) -> int:
    """Check everything, start the ranks, print measured beside predicted. SIGTERM (SIGHUP,
    SIGQUIT) stops every rank and ends with one line and 128 + the signal (SIGINT: 130)."""
    cfg, peak, notes = check(args)
    if not under_torchrun():
        # Imported here: multiprocessing's fork server, which no other command starts.
        from shardlab.distributed import forkserver

        # Started before this process imports torch: the server's imports (torch, the rank
        # modules) run beside this process's own, and the ranks fork from it warm.
        forkserver.start()
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.distributed.launch import Terminated, signals_stop

    try:
        with signals_stop(), _run_lock(cfg):
            return _train(args, make_log_folder(cfg), peak, notes)
    except Terminated as e:
        sys.stderr.write(f"shardlab train: {e}; every rank stopped\n")
        return 128 + e.signum


def _run_lock(cfg: TrainConfig) -> Any:
    """The checkpoint folder's run lock (made first), or nothing: no checkpoint folder, or
    a worker of torchrun, whose agents coordinate the job's processes themselves."""
    if not cfg.checkpoint_dir or under_torchrun():
        return contextlib.nullcontext()
    make_folder("checkpoint_dir", cfg.checkpoint_dir)
    return checkpoint_lock(cfg.checkpoint_dir)


def _train(args: argparse.Namespace, cfg: TrainConfig, peak: float | None,
           notes: list[str]) -> int:
    """The ranks started (and restarted) and the run's report, the checks all passed."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.distributed import checkpoint_manifest
    from shardlab.distributed.launch import LaunchError
    from shardlab.train.progress import launch_training
    from shardlab.train.reference import reference_run
    from shardlab.train.resume import data_record

    shape, log_dir = cfg.shape, cfg.log_dir
    note = dtype_note(cfg.dtype, args.gpu)
    for line in [*notes, *([note] if note else [])]:
        sys.stderr.write(f"shardlab train: note: {line}\n")
    reference = reference_run(cfg) if args.check_parity else None
    restarts = []
    while True:
        try:
            ranks = launch_training(cfg, args.timeout,
                                    bar=not (args.json or under_torchrun()))
            break
        except LaunchError as e:
            steps = checkpoint_manifest.complete_steps(args.checkpoint_dir or "")
            if len(restarts) >= args.max_restarts or under_torchrun():
                sys.stderr.write(f"shardlab train: {e}\n")
                return 1
            # Elastic restart: the whole job again, from the last checkpoint written.
            folder = checkpoint_manifest.find(args.checkpoint_dir, None) if steps else None
            if folder is not None:
                doc = checkpoint_manifest.verify(folder)
                checkpoint_manifest.check_compatible(doc, shape, data_record(cfg), str(folder))
            restarts.append({"error": str(e).splitlines()[0],
                             "resumed_from": str(folder) if folder else None})
            sys.stderr.write(f"shardlab train: {str(e).splitlines()[0]}; restart "
                             f"{len(restarts)} of {args.max_restarts} from "
                             f"{folder.name if folder else 'step 0'}\n")
            cfg = dataclasses.replace(cfg, attempt=cfg.attempt + 1,
                                      resume_from=str(folder) if folder else "")
    if not ranks:  # a non-zero rank under torchrun
        return 0
    bad = ranks[0].get("non_finite")
    if bad:  # every rank stopped at the same step (the loss and the norm are global)
        what = "loss" if not math.isfinite(bad["loss"]) else "gradient norm"
        sys.stderr.write(f"shardlab train: step {bad['step'] + 1} of {cfg.steps}: the {what} "
                         f"is not finite (loss {bad['loss']:.6g}, gradient norm "
                         f"{bad['grad_norm']:.6g}); training stopped: try a smaller --lr, or "
                         f"check --init-from's weights (log in {log_dir})\n")
        return 1
    doc = report(cfg, ranks, reference, log_dir, peak)
    doc["notes"] = [note] if note else []
    if cfg.checkpoint_dir:
        saves = ranks[0]["checkpoint_seconds"]
        doc["checkpoint"] = {
            "dir": cfg.checkpoint_dir, "resumed_from": cfg.resume_from or None,
            "resumed_at_step": ranks[0]["resumed_at"], "restarts": restarts,
            "kept": sorted(checkpoint_manifest.complete_steps(cfg.checkpoint_dir)),
            "save_seconds": saves, "async": ranks[0]["checkpoint_async"]}  # as it ran
    # The run directory `shardlab report run` reads: written whole, then renamed into place.
    tmp = Path(log_dir, "report.json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(Path(log_dir, "report.json"))
    if cfg.tensorboard:  # the run's summary beside rank 0's per-step scalars
        # Imported here: tensorboardX, which only a run with --tensorboard needs.
        from shardlab.train.tensorboard import RunBoard

        board = RunBoard(cfg.tensorboard, cfg.shape, cfg.seq, peak, suffix="run")
        board.finish(doc)
        board.close()
    if args.json:
        print_json(doc)
    else:
        print_train(doc)
        print_moe(doc)
        if "checkpoint" in doc:
            _print_checkpoints(doc["checkpoint"])
    return 0 if doc.get("parity_passed", True) else 1


def _shape_flags(args: argparse.Namespace) -> None:
    """Refuse a shape flag given beside MODEL or --init-from (whose config.json is the
    shape), rather than ignore it (:func:`shardlab.cli.args.shape_flags`)."""
    source = (f"MODEL ({args.model})" if args.model is not None
              else f"--init-from ({args.init_from}/config.json)" if args.init_from is not None
              else None)
    shape_flags(args, source)


def _check_memory(cfg: TrainConfig, args: argparse.Namespace) -> None:
    """The memory guard: the cost model's peak of the fullest rank (weights, gradients,
    AdamW moments, activations held) x the ranks on this host, against what this host has
    available. (--check-parity's one-process reference trains before the ranks start and
    holds about what they hold together, so the same check covers it.)"""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world)) if under_torchrun() else cfg.world
    extra = (f" ep={cfg.ep}" if cfg.ep > 1 else "") + (f" cp={cfg.cp}" if cfg.cp > 1 else "")
    layout = (f"dp={cfg.dp} tp={cfg.tp} pp={cfg.pp}{extra} "
              f"{cfg.dtype}, micro-batch "
              f"{cfg.micro_batch or cfg.global_batch // cfg.dp} x {cfg.seq} tokens")
    name = cfg.shape.name if cfg.shape.name != "flags" else cfg.shape.describe()
    check_memory(predicted_peak_bytes(cfg), local, f"shardlab train {name} ({layout})",
                 args.allow_oversubscribe)


def _init_folder(args: argparse.Namespace) -> Path | None:
    """``--init-from``'s folder, checked to be what ``shardlab import`` writes."""
    if args.init_from is None:
        return None
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.hf.weights import MARKER, WEIGHTS

    folder = Path(args.init_from)
    if not (folder / MARKER).is_file() or not (folder / WEIGHTS).is_file():
        raise SpecError("init_from", str(folder), f"is not a folder `shardlab import` wrote "
                        f"(needs {MARKER} and {WEIGHTS}); import a Hugging Face folder first")
    if args.model is not None and Path(args.model).resolve() != (folder / "config.json").resolve():
        raise SpecError("model", args.model, f"must be left out with --init-from (the model "
                        f"is {folder / 'config.json'})")
    return folder


def _print_checkpoints(info: dict[str, Any]) -> None:
    if info["resumed_from"]:
        print(f"resumed from {info['resumed_from']} (step {info['resumed_at_step']})")
    for r in info["restarts"]:
        print(f"restarted after: {r['error']}")
    saves = info["save_seconds"]
    kept = ", ".join(f"step-{s}" for s in info["kept"])
    median = f", median save {statistics.median(saves):.3f} s" if saves else ""
    print(f"checkpoints in {info['dir']}: {kept}{median}"
          f"{' (async)' if info['async'] else ''}")
