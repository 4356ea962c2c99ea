"""``shardlab simulate``: K virtual devices in one process, checked against one device and
against the cost model."""

from __future__ import annotations

import argparse
from typing import Any

from shardlab.cli.args import add_shape_args, build_shape, nonneg_int, positive_float, positive_int
from shardlab.cli.output import print_json
from shardlab.config.hardware import LINKS
from shardlab.config.lookup import find
from shardlab.errors import SpecError
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.report.simulate_view import print_simulation

SIM_SCHEDULES = ("gpipe", "1f1b")


def register(sub: Any) -> None:
    """Add the ``simulate`` sub-command."""
    p = sub.add_parser("simulate", help="virtual devices in one process, checked exactly",
                       description="Train a layout on K virtual devices in one process and "
                       "check losses, parameters, bytes sent and bytes held against one "
                       "device and the cost model.")
    p.add_argument("model", nargs="?", help="catalog name or config.json (default: a small "
                   "model from the shape flags)")
    add_shape_args(p)
    g = p.add_argument_group("layout")
    g.add_argument("--dp", type=positive_int, default=2)
    g.add_argument("--tp", type=positive_int, default=1)
    g.add_argument("--pp", type=positive_int, default=1)
    g.add_argument("--zero", type=nonneg_int, default=0, help="ZeRO stage 0-3")
    g.add_argument("--sp", action="store_true", help="sequence parallel (needs tp > 1)")
    g.add_argument("--microbatches", type=positive_int, default=2,
                   help="micro-batches per replica")
    g.add_argument("--schedule", choices=SIM_SCHEDULES, default="1f1b")
    g.add_argument("--link", help="time every collective on this link (alpha-beta), e.g. "
                   "'NVLink 4' (`shardlab hardware` lists them)")
    g.add_argument("--global-batch", type=positive_int,
                   help="sequences per step (default dp x microbatches x 2)")
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=positive_int, default=3)
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    g.add_argument("--seed", type=nonneg_int, default=0)
    g.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW learning rate")
    g.add_argument("--adam-eps", type=positive_float, default=1e-6,
                   help="AdamW epsilon (1e-6: see docs/guide/simulate.md on fp32 checks)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Validate everything, then simulate and print; exit 1 when a check fails."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    import torch

    from shardlab.nn.data import batches
    from shardlab.sim.engine import AdamWConfig, Parallel
    from shardlab.sim.run import layout_for, simulate_run

    vocab = garden_vocab().size
    shape = build_shape(args, vocab)
    if args.zero > 3:
        raise SpecError("zero", args.zero, "must be 0, 1, 2 or 3")
    par = Parallel(dp=args.dp, tp=args.tp, pp=args.pp, zero=args.zero, sp=args.sp,
                   microbatches=args.microbatches, schedule=args.schedule)
    link = None
    if args.link is not None:
        link = find("link", args.link, LINKS)
    global_batch = args.global_batch or args.dp * args.microbatches * 2
    if global_batch % (args.dp * args.microbatches):
        raise SpecError("global_batch", global_batch,
                        f"must be a multiple of dp x microbatches ({args.dp}x{args.microbatches})")
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    layout_for(shape, par, global_batch, args.seq, dtype)  # every layout check, before work

    docs = garden_documents(max(200, 4 * global_batch * args.steps), args.seed)
    stream = batches(docs, global_batch, args.seq, seed=args.seed)
    result = simulate_run(shape, par, [next(stream) for _ in range(args.steps)], dtype,
                          args.seed, AdamWConfig(lr=args.lr, eps=args.adam_eps), link)
    doc = result_doc(shape, result)
    if args.json:
        print_json(doc)
    else:
        print_simulation(doc)
    return 0 if result.passed else 1


def result_doc(shape: Any, r: Any) -> dict[str, Any]:
    """The JSON document of a simulated run."""
    return {
        "model": shape.describe(), "layout": r.layout.describe(), "algorithm": "ring",
        "devices": r.layout.gpus, "passed": r.passed,
        "max_param_diff": r.max_param_diff, "max_loss_diff": r.max_loss_diff,
        "losses": r.losses, "reference_losses": r.reference_losses,
        "checks": [{"name": c.name, "value": c.value, "tolerance": c.tolerance,
                    "passed": c.passed} for c in r.checks],
        "comm": r.comm, "state_bytes": r.state_bytes,
    }
