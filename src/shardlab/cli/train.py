"""``shardlab train``: real training on a (pp, dp, tp) device mesh, with the cost model beside."""

from __future__ import annotations

import argparse
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
    peak = _peak_flops(cfg, args.gpu, world)  # a bad --gpu fails here, before any rank
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


def report(cfg: Any, ranks: list[dict[str, Any]], reference: list[float] | None,
           log_dir: str, peak: float | None = None) -> dict[str, Any]:
    """Measured beside predicted, and parity with one process."""
    import statistics

    from shardlab.estimate.flops import flops_per_token
    from shardlab.estimate.memory import zero_state_bytes
    from shardlab.estimate.partition import stage_params
    from shardlab.spec.dtypes import get_policy

    r0 = ranks[0]
    losses = r0["losses"]
    tokens = cfg.global_batch * cfg.seq
    step_s = statistics.median(r0["step_seconds"][1:] or r0["step_seconds"])
    fpt = flops_per_token(cfg.shape, cfg.seq, cfg.recompute)
    predicted_flops = fpt.hardware_train * tokens
    measured_flops = measured_step_flops(ranks)
    policy = get_policy("amp-bf16" if cfg.dtype == "bf16" else "fp32")
    zero = 0 if cfg.dp == 1 or cfg.dp_mode == "ddp" else 3
    psi = stage_params(cfg.shape, cfg.tp, cfg.pp, cfg.virtual_stages,
                       vocab_parallel=cfg.tp > 1)
    memory = []
    for r in ranks:
        pred = zero_state_bytes(psi[r["pp_rank"]], policy, zero, cfg.dp)
        memory.append({"rank": r["rank"], "measured": r["state_bytes"],
                       "predicted": {"weights": pred.weights, "gradients": pred.gradients,
                                     "optimizer": pred.optimizer}})
    from shardlab.estimate.activations import (
        first_stage_extra_bytes,
        last_stage_extra_bytes,
        layer_activation_bytes,
    )

    # One micro-batch, shardlab's eager LM (no dropout; the CPU attention kernel is fused).
    e = 2 if cfg.dtype == "bf16" else 4
    mb = cfg.micro_batch or cfg.global_batch // cfg.dp
    kw = {"tp": cfg.tp, "sp": cfg.sp}
    predicted_act = (cfg.shape.layers * layer_activation_bytes(
        cfg.shape, mb, cfg.seq, e, recompute=cfg.recompute, dropout=False, flash=True,
        eager=True, **kw) + first_stage_extra_bytes(cfg.shape, mb, cfg.seq, dropout=False, **kw)
        + last_stage_extra_bytes(cfg.shape, mb, cfg.seq, e, **kw))
    measured_act = r0.get("activation_bytes")
    comm_rows = comm_table(cfg, ranks)
    doc: dict[str, Any] = {
        "model": cfg.shape.describe(),
        "layout": f"dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} {cfg.dp_mode} sp={int(cfg.sp)} "
                  f"recompute={cfg.recompute} schedule={cfg.schedule} dtype={cfg.dtype}",
        "world_size": len(ranks), "steps": cfg.steps, "log_dir": log_dir,
        "losses": losses, "grad_norms": r0["grad_norms"],
        "step_seconds": statistics.median(r0["step_seconds"]),
        "tokens_per_s": tokens / step_s,
        "mfu": fpt.train * tokens / step_s / peak if peak else None,
        "hfu": fpt.hardware_train * tokens / step_s / peak if peak else None,
        "peak_flops": peak,
        "memory_per_rank": memory,
        "comm_bytes_per_step": comm_rows,
        "predicted_vs_measured": {
            "flops_per_step": {"predicted": predicted_flops, "measured": measured_flops,
                               "ratio": measured_flops / predicted_flops},
            "comm_bytes_per_step": comm_rows,
            "activation_bytes_per_microbatch": {
                "predicted": predicted_act if cfg.pp == 1 else None,
                "measured": measured_act,
                "ratio": measured_act / predicted_act if measured_act and cfg.pp == 1
                else None},
        },
    }
    if reference is not None:
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
        tol = 1e-5 if cfg.dtype == "fp32" else 2e-2
        doc.update({"reference_losses": reference, "max_loss_diff": diff,
                    "parity_tolerance": tol, "parity_passed": diff <= tol})
    return doc


def comm_table(cfg: Any, ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank, bytes sent in step 1 by data parallelism and by pipeline sends, measured
    (dispatch-mode meter) beside the cost model's ring figures for the same layout.

    Data parallel: FSDP2 (ZeRO-3: weights gathered for every micro-batch's forward and
    backward, one gradient reduce-scatter) or DDP (one all-reduce of the gradients);
    ``fsdp-zero2`` and tensor parallelism are measured but not compared (torch's TP sends
    one backward all-reduce per column-parallel linear, not Megatron's one per block
    half that ``estimate/comm.py`` counts).
    """
    from shardlab.estimate.comm import dp_bytes_per_step, pp_bytes_per_rank
    from shardlab.estimate.partition import stage_params
    from shardlab.spec.dtypes import get_policy
    from shardlab.spec.layout import make_layout

    policy = get_policy("amp-bf16" if cfg.dtype == "bf16" else "fp32")
    share = cfg.global_batch // cfg.dp
    lay = make_layout(cfg.shape, dp=cfg.dp, tp=cfg.tp, pp=cfg.pp,
                      virtual_stages=cfg.virtual_stages, sp=cfg.sp,
                      micro_batch=cfg.micro_batch or share, global_batch=cfg.global_batch,
                      seq=cfg.seq, dtype=policy.name,
                      schedule=cfg.schedule if cfg.pp > 1 else None)
    psi = stage_params(cfg.shape, cfg.tp, cfg.pp, cfg.virtual_stages,
                       vocab_parallel=cfg.tp > 1 and not cfg.shape.tied)
    # Each activation travels with its micro-batch's int64 padding mask (b x s x 8 bytes).
    mask = (cfg.micro_batch or share) * cfg.seq * 8
    forward_sends = [sum(1 for c in range(lay.pp * lay.virtual_stages - 1) if c % lay.pp == r)
                     for r in range(lay.pp)]
    pp_pred = [b + f * lay.microbatches * mask for b, f in
               zip(pp_bytes_per_rank(cfg.shape, lay, split_by_tp=cfg.sp), forward_sends,
                   strict=True)]
    rows = []
    for r in ranks:
        got = r["comm_step1"]

        def sent(kind: str, got: dict[str, Any] = got) -> float:
            return float(got.get(kind, {}).get("sent_bytes", 0.0))

        row: dict[str, Any] = {"rank": r["rank"], "measured": got}
        if cfg.dp > 1 and cfg.dp_mode in ("fsdp", "ddp"):
            zero = 3 if cfg.dp_mode == "fsdp" else 0
            row["dp"] = {"predicted": dp_bytes_per_step(psi[r["pp_rank"]], policy, zero,
                                                        cfg.dp, cfg.microbatches),
                         "measured": sent("all_gather") + sent("reduce_scatter")
                         if zero else sent("all_reduce")}
        if cfg.pp > 1:
            row["pp"] = {"predicted": pp_pred[r["pp_rank"]], "measured": sent("send")}
        rows.append(row)
    return rows


def measured_step_flops(ranks: list[dict[str, Any]]) -> int:
    """FLOPs of one step over all ranks, from each rank's FlopCounterMode.

    The counter sees a DTensor operation at its global shape, so with tensor
    parallelism every rank of a tensor-parallel group counts the whole matmul: those
    are taken from the group's rank 0 only. The attention kernel runs on each rank's
    own heads as plain tensors and is summed over all ranks.
    """
    total = 0
    for r in ranks:
        for op, n in r["flops_by_op"].items():
            if "scaled_dot_product" in op or r["tp_rank"] == 0:
                total += n
    return total


def _peak_flops(cfg: Any, gpu: str | None, world: int) -> float | None:
    """The job's dense peak FLOP/s for MFU: ``--gpu``'s peak x ranks, or, by default,
    this whole machine as ``shardlab hardware --measure`` stored it (ranks share its
    cores); None when neither is known."""
    from shardlab.spec.measure import accelerator_or_measured, load_measurement

    dtype = "bf16" if cfg.dtype == "bf16" else "fp32"
    if gpu is not None:
        acc = accelerator_or_measured(gpu)
        shared = acc.name == "cpu (measured)"
        return acc.peak(dtype) * (1 if shared else world)
    acc = load_measurement()
    return acc.peak(dtype) if acc is not None else None
