"""``shardlab train``: real training on a (pp, dp, tp) device mesh, with the cost model beside."""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any

from shardlab.cli.args import nonneg_int, positive_float, positive_int
from shardlab.cli.output import print_json
from shardlab.errors import SpecError


def register(sub: Any) -> None:
    """Add the ``train`` sub-command."""
    from shardlab.cli.simulate import add_shape_args
    from shardlab.train import DP_MODES, PP_SCHEDULES

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
    g.add_argument("--inject-fault", type=int, default=-1, help=argparse.SUPPRESS)
    g.add_argument("--check-parity", action="store_true",
                   help="also train on one process and compare the loss curves")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def load_documents(args: argparse.Namespace) -> tuple[int, list[list[int]]]:
    """(vocabulary size, documents) of the chosen corpus; SpecError if a file is bad."""
    from shardlab.nn.data import bin_documents, byte_documents

    if args.data == "garden":
        from shardlab.nn.garden import garden_documents, garden_vocab

        return garden_vocab().size, garden_documents(2000, args.seed)
    path = Path(args.data)
    if path.suffix == ".bin":
        docs = bin_documents(path, args.bin_dtype, doc_tokens=args.seq + 1)
        return max(max(d) for d in docs) + 1, docs
    return byte_documents(path, doc_tokens=args.seq + 1)


def run(args: argparse.Namespace) -> int:
    """Check everything, start the ranks, print measured beside predicted."""
    from shardlab.cli.simulate import build_shape
    from shardlab.dist.launch import LaunchError, launch, under_torchrun
    from shardlab.train import TrainConfig, check_config, reference_run
    from shardlab.train_report import peak_flops, report

    vocab, docs = load_documents(args)
    shape = build_shape(args, vocab)
    if args.seq > shape.context and shape.style == "gpt":
        raise SpecError("seq", args.seq, f"must be <= context ({shape.context})")
    if len(docs) < args.global_batch:
        raise SpecError("data", args.data, f"has {len(docs)} documents; a step needs "
                        f"{args.global_batch}")
    import tempfile

    log_dir = args.log_dir or tempfile.mkdtemp(prefix="shardlab-train-")
    cfg = TrainConfig(shape=shape, dp=args.dp, tp=args.tp, pp=args.pp,
                      virtual_stages=args.virtual_stages, dp_mode=args.dp_mode, sp=args.sp,
                      loss_parallel=args.loss_parallel, recompute=args.recompute,
                      schedule=args.schedule, global_batch=args.global_batch,
                      micro_batch=args.micro_batch, seq=args.seq, steps=args.steps, lr=args.lr,
                      warmup=args.warmup, clip=args.clip, dtype=args.dtype, seed=args.seed,
                      log_dir=log_dir, fault_rank=args.inject_fault, docs=docs)
    check_config(cfg)
    world = cfg.world
    peak = peak_flops(cfg, args.gpu, world)  # a bad --gpu fails here, before any rank
    if args.nproc is not None and args.nproc != world and not under_torchrun():
        raise SpecError("nproc", args.nproc, f"must equal dp*tp*pp ({world})")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    reference = reference_run(cfg) if args.check_parity else None
    try:
        ranks = _launch_with_progress(cfg, world, args, launch, log_dir)
    except LaunchError as e:
        import sys

        sys.stderr.write(f"shardlab train: {e}\n")
        return 1
    if not ranks:  # a non-zero rank under torchrun
        return 0
    doc = report(cfg, ranks, reference, log_dir, peak)
    # The run directory `shardlab report run` reads: written whole, then renamed into place.
    tmp = Path(log_dir, "report.json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(Path(log_dir, "report.json"))
    if args.json:
        print_json(doc)
    else:
        from shardlab.report.train_view import print_train

        print_train(doc)
    return 0 if doc.get("parity_passed", True) else 1


def _launch_with_progress(cfg: Any, world: int, args: argparse.Namespace, launch: Any,
                          log_dir: str) -> list[Any]:
    """Run the ranks in a thread; show rank 0's steps from its JSONL log as they land."""
    from shardlab.dist.launch import under_torchrun

    target = "shardlab.train:train_rank"
    if under_torchrun() or args.json:
        return launch(target, world, (cfg,), timeout_s=args.timeout, log_dir=log_dir)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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
                import json

                lines = log.read_text().splitlines()
                if lines:
                    last = json.loads(lines[-1])
                    bar.update(task, completed=len(lines),
                               description=f"loss {last['loss']:.4f}")
    if "error" in result:
        raise result["error"]
    return result["ranks"]
