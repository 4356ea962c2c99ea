"""``shardlab train``: real training on a (pp, dp, tp) device mesh, with the cost model beside."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shardlab.cli.args import add_shape_args, build_shape, nonneg_int, positive_float, positive_int
from shardlab.cli.output import print_json
from shardlab.config.measured import NAMES, load_measurement, slow_dtype_note
from shardlab.errors import SpecError
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.report.train_view import print_train
from shardlab.train.config import DP_MODES, PP_SCHEDULES, TrainConfig, check_config
from shardlab.train.report import peak_flops, report


def register(sub: Any) -> None:
    """Add the ``train`` sub-command."""
    p = sub.add_parser("train", help="real training on a device mesh (FSDP2/DDP, TP, PP)",
                       description="Train shardlab's LM on dp x tp x pp real processes and "
                       "print the cost model's prediction beside what the run measured.")
    p.add_argument("model", nargs="?", help="catalog name or config.json (default: a small "
                   "model from the shape flags)")
    add_shape_args(p)
    g = p.add_argument_group("layout")
    g.add_argument("--dp", type=positive_int, default=1)
    g.add_argument("--tp", type=positive_int, default=1)
    g.add_argument("--pp", type=positive_int, default=1)
    g.add_argument("--virtual-stages", type=positive_int, default=1)
    g.add_argument("--dp-mode", choices=DP_MODES, default="fsdp",
                   help="fsdp (ZeRO-3), fsdp-zero2 (reshard_after_forward=False) or ddp")
    g.add_argument("--sp", action="store_true", help="sequence parallel (needs tp > 1)")
    g.add_argument("--loss-parallel", action="store_true",
                   help="cross-entropy on the vocabulary-sharded logits (tp > 1)")
    g.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    g.add_argument("--schedule", choices=PP_SCHEDULES, default="1f1b")
    g = p.add_argument_group("run")
    g.add_argument("--global-batch", type=positive_int, default=8, help="sequences per step")
    g.add_argument("--micro-batch", type=nonneg_int, default=0,
                   help="sequences per micro-batch (0: a data-parallel rank's whole share)")
    g.add_argument("--steps", type=positive_int, default=20)
    g.add_argument("--lr", type=positive_float, default=3e-3)
    g.add_argument("--warmup", type=nonneg_int, default=2)
    g.add_argument("--clip", type=positive_float, default=1.0)
    g.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    g.add_argument("--seed", type=nonneg_int, default=0)
    g.add_argument("--data", default="garden",
                   help="garden (built in), a text file (bytes), or a .bin of token ids")
    g.add_argument("--bin-dtype", choices=("uint16", "uint32"), default="uint16")
    g.add_argument("--nproc", type=positive_int, help="ranks to start (default dp*tp*pp)")
    g.add_argument("--gpu", help="accelerator whose dense peak MFU divides by, per rank "
                   "(default: this CPU as `shardlab hardware --measure` stored it)")
    g.add_argument("--timeout", type=positive_float, default=60.0)
    g.add_argument("--log-dir", help="per-rank logs and train.jsonl (default: a new folder)")
    g.add_argument("--check-parity", action="store_true",
                   help="also train on one process and compare the loss curves")
    g = p.add_argument_group("checkpoints (docs/guide/checkpoint.md)")
    g.add_argument("--checkpoint-dir", help="write checkpoints under this folder (step-N)")
    g.add_argument("--checkpoint-every", type=nonneg_int, default=0,
                   help="save every K steps (and always after the last; 0: only then)")
    g.add_argument("--keep", type=positive_int, default=3, help="checkpoints kept (newest)")
    g.add_argument("--async-save", action="store_true",
                   help="dcp.async_save: write in the background while training goes on")
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
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def load_documents(args: argparse.Namespace) -> tuple[int, list[list[int]]]:
    """(vocabulary size, documents) of the chosen corpus; SpecError if a file is bad."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.nn.data import bin_documents, byte_documents

    if args.data == "garden":
        return garden_vocab().size, garden_documents(2000, args.seed)
    path = Path(args.data)
    if path.suffix == ".bin":
        docs = bin_documents(path, args.bin_dtype, doc_tokens=args.seq + 1)
        return max(max(d) for d in docs) + 1, docs
    return byte_documents(path, doc_tokens=args.seq + 1)


def prepare(args: argparse.Namespace) -> tuple[Any, float | None]:
    """The run's TrainConfig and the peak MFU divides by, every check done and the log and
    checkpoint folders made: what ``run`` launches (and the tests, several runs at once)."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.distributed import checkpoint_manifest
    from shardlab.distributed.launch import under_torchrun

    vocab, docs = load_documents(args)
    init = _init_folder(args)
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
    data_id = checkpoint_manifest.data_fingerprint(docs) if args.checkpoint_dir else ""
    resume_from = _resume_folder(args, shape, data_id, attempt)

    log_dir = args.log_dir or tempfile.mkdtemp(prefix="shardlab-train-")
    cfg = TrainConfig(shape=shape, dp=args.dp, tp=args.tp, pp=args.pp,
                      virtual_stages=args.virtual_stages, dp_mode=args.dp_mode, sp=args.sp,
                      loss_parallel=args.loss_parallel, recompute=args.recompute,
                      schedule=args.schedule, global_batch=args.global_batch,
                      micro_batch=args.micro_batch, seq=args.seq, steps=args.steps, lr=args.lr,
                      warmup=args.warmup, clip=args.clip, dtype=args.dtype, seed=args.seed,
                      log_dir=log_dir, fail_at_step=fail_at, fail_rank=fail_rank,
                      fail_how=args.fail_how, attempt=attempt,
                      checkpoint_dir=args.checkpoint_dir or "",
                      checkpoint_every=args.checkpoint_every, keep=args.keep,
                      async_save=args.async_save, resume_from=resume_from,
                      init_from=str(init) if init is not None else "", data_id=data_id,
                      docs=docs)
    check_config(cfg)
    world = cfg.world
    peak = peak_flops(cfg, args.gpu, world)  # a bad --gpu fails here, before any rank
    if args.nproc is not None and args.nproc != world and not under_torchrun():
        raise SpecError("nproc", args.nproc, f"must equal dp*tp*pp ({world})")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    if args.checkpoint_dir:
        Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    return cfg, peak


def dtype_note(dtype: str, gpu: str | None) -> str | None:
    """The line that says ``dtype`` is slow on this machine (an emulated matmul kernel, as
    ``shardlab hardware --measure`` found), or None (fast, another --gpu, or unmeasured)."""

    if gpu is not None and gpu.strip().lower() not in NAMES:
        return None
    acc = load_measurement()
    return slow_dtype_note(acc, dtype) if acc is not None else None


def run(args: argparse.Namespace) -> int:
    """Check everything, start the ranks, print measured beside predicted."""

    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.distributed import checkpoint_manifest
    from shardlab.distributed.launch import LaunchError, launch, under_torchrun
    from shardlab.train.reference import reference_run

    cfg, peak = prepare(args)
    shape, world, log_dir = cfg.shape, cfg.world, cfg.log_dir
    note = dtype_note(cfg.dtype, args.gpu)
    if note:
        sys.stderr.write(f"shardlab train: note: {note}\n")
    reference = reference_run(cfg) if args.check_parity else None
    restarts = []
    while True:
        try:
            ranks = _launch_with_progress(cfg, world, args, launch, log_dir)
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
                checkpoint_manifest.check_compatible(doc, shape, cfg_data(cfg), str(folder))
            restarts.append({"error": str(e).splitlines()[0],
                             "resumed_from": str(folder) if folder else None})
            sys.stderr.write(f"shardlab train: {str(e).splitlines()[0]}; restart "
                             f"{len(restarts)} of {args.max_restarts} from "
                             f"{folder.name if folder else 'step 0'}\n")
            cfg = dataclasses.replace(cfg, attempt=cfg.attempt + 1,
                                      resume_from=str(folder) if folder else "")
    if not ranks:  # a non-zero rank under torchrun
        return 0
    doc = report(cfg, ranks, reference, log_dir, peak)
    doc["notes"] = [note] if note else []
    if cfg.checkpoint_dir:
        saves = ranks[0]["checkpoint_seconds"]
        doc["checkpoint"] = {
            "dir": cfg.checkpoint_dir, "resumed_from": cfg.resume_from or None,
            "resumed_at_step": ranks[0]["resumed_at"], "restarts": restarts,
            "kept": sorted(checkpoint_manifest.complete_steps(cfg.checkpoint_dir)),
            "save_seconds": saves, "async": cfg.async_save}
    # The run directory `shardlab report run` reads: written whole, then renamed into place.
    tmp = Path(log_dir, "report.json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(Path(log_dir, "report.json"))
    if args.json:
        print_json(doc)
    else:
        print_train(doc)
        if "checkpoint" in doc:
            _print_checkpoints(doc["checkpoint"])
    return 0 if doc.get("parity_passed", True) else 1


def cfg_data(cfg: Any) -> dict[str, Any]:
    """What a checkpoint's data position must match (``DATA_FIELDS`` of
    :mod:`shardlab.distributed.checkpoint_manifest`)."""
    return {"fingerprint": cfg.data_id, "seed": cfg.seed, "global_batch": cfg.global_batch,
            "seq": cfg.seq}


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


def _resume_folder(args: argparse.Namespace, shape: Any, data_id: str, attempt: int) -> str:
    """The verified checkpoint folder to resume from ("" for a fresh start)."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.distributed import checkpoint_manifest

    which = args.resume
    restarted = attempt > 0 and checkpoint_manifest.complete_steps(args.checkpoint_dir or "")
    if which is None and restarted:
        which = "latest"  # a worker torchrun restarted: continue from the last checkpoint
    if which is None:
        return ""
    if not args.checkpoint_dir:
        raise SpecError("resume", which, "needs --checkpoint-dir (where the checkpoints are)")
    if which == "latest":
        step = None
    elif which.isdigit():
        step = int(which)
    else:
        raise SpecError("resume", which, "must be a step number, or nothing for the latest")
    folder = checkpoint_manifest.find(args.checkpoint_dir, step)
    doc = checkpoint_manifest.verify(folder)
    checkpoint_manifest.check_compatible(doc, shape, {"fingerprint": data_id, "seed": args.seed,
                                             "global_batch": args.global_batch,
                                             "seq": args.seq}, str(folder))
    if doc["step"] >= args.steps:
        raise SpecError("steps", args.steps, f"must be more than the checkpoint's step "
                        f"({doc['step']}) to continue training")
    return str(folder)


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


def _launch_with_progress(cfg: Any, world: int, args: argparse.Namespace, launch: Any,
                          log_dir: str) -> list[Any]:
    """Run the ranks in a thread; show rank 0's steps from its JSONL log as they land."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.distributed.launch import under_torchrun

    target = "shardlab.train.loop:train_rank"
    if under_torchrun() or args.json:
        return launch(target, world, (cfg,), timeout_s=args.timeout, log_dir=log_dir)

    result: dict[str, Any] = {}

    def body() -> None:
        try:
            result["ranks"] = launch(target, world, (cfg,), timeout_s=args.timeout,
                                     log_dir=log_dir)
        except BaseException as e:  # handed to the caller below
            result["error"] = e

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    log = Path(log_dir, "train.jsonl")
    with Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                  TextColumn("{task.description}"), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task("starting ranks", total=cfg.steps)
        while thread.is_alive():
            thread.join(0.2)
            if log.exists():
                lines = log.read_text().splitlines()
                if lines:
                    last = json.loads(lines[-1])
                    bar.update(task, completed=last["step"] + 1,
                               description=f"loss {last['loss']:.4f}")
    if "error" in result:
        raise result["error"]
    return result["ranks"]
