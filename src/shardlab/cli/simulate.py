"""``shardlab simulate``: K virtual devices in one process, checked against one device and
against the cost model."""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shardlab.cli.args import (
    add_shape_args,
    build_shape,
    nonneg_float,
    nonneg_int,
    number_in,
    positive_float,
    positive_int,
    shape_flags,
)
from shardlab.cli.guard import check_host_memory
from shardlab.cli.output import print_json
from shardlab.config.hardware import LINKS
from shardlab.config.layout import parse_stage_layers
from shardlab.config.lookup import find
from shardlab.config.model import MOE_ROUTINGS, require_buildable
from shardlab.errors import SpecError
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.report.simulate_view import print_simulation
from shardlab.train.config import AUX_COEF

SIM_SCHEDULES = ("gpipe", "1f1b")
DOC_STEPS = 16
"""Steps' worth of fresh documents drawn up front (four global batches each); longer runs
go round them again in a new order, so the corpus stays the same size however many steps."""


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
    g.add_argument("--cp", type=positive_int, default=1,
                   help="context-parallel devices per replica: each holds 2 of 2cp sequence "
                   "chunks (i and 2cp-1-i) and all-gathers K and V in every layer")
    g.add_argument("--stage-layers", metavar="N,N,...",
                   help="layers of each pipeline stage, e.g. 3,1 (or 3+1; default: even)")
    g.add_argument("--dp-replicate", type=positive_int, default=1,
                   help="HSDP: dp = R replicas x dp/R shards; ZeRO shards inside a replica, "
                   "gradient shards are all-reduced across replicas (needs --zero >= 1)")
    g.add_argument("--zero", type=nonneg_int, default=0, help="ZeRO stage 0-3")
    g.add_argument("--sp", action="store_true", help="sequence parallel (needs tp > 1)")
    g.add_argument("--microbatches", type=positive_int, default=2,
                   help="micro-batches per replica")
    g.add_argument("--schedule", choices=SIM_SCHEDULES, default="1f1b")
    g.add_argument("--link", help="time every collective on this link (alpha-beta), e.g. "
                   "'NVLink 4' (`shardlab hardware` lists them)")
    g.add_argument("--global-batch", type=positive_int,
                   help="sequences per step (default dp x microbatches x 2)")
    g = p.add_argument_group("mixture of experts (with --experts or a MoE MODEL)")
    g.add_argument("--ep", type=positive_int, default=1,
                   help="expert-parallel devices, drawn from dp: each holds experts/ep of "
                   "every MoE layer, tokens reach them by all-to-all")
    g.add_argument("--etp", type=positive_int, default=1,
                   help="expert tensor parallel: 1 keeps experts whole on every tp device "
                   "(the only one the simulator runs)")
    g.add_argument("--capacity-factor", type=nonneg_float, default=0.0,
                   help="each expert takes at most ceil(F*tokens*top_k/experts) of a "
                   "micro-batch's tokens per device, the rest are dropped (0: dropless)")
    g.add_argument("--routing", choices=MOE_ROUTINGS, default="learned",
                   help="MoE routing, as train's --routing: learned (the router's top-k) "
                   "or contiguous (token t's slot j at expert (t*k+j) mod E, every count "
                   "known in advance)")
    g.add_argument("--aux-loss-coef", type=nonneg_float, default=AUX_COEF,
                   help="weight of the load-balancing loss (default, as train's: Switch "
                   "Transformer's 0.01)")
    g.add_argument("--router-z-loss", type=nonneg_float, default=0.0,
                   help="weight of the router z-loss (ST-MoE: 0.001; 0: off)")
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=positive_int, default=3)
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    g.add_argument("--seed", type=nonneg_int, default=0)
    g.add_argument("--lr", type=number_in(1e-9, 1.0), default=1e-3,
                   help="AdamW learning rate, 1e-9 to 1 (a rate of 1e3 blew the weights up "
                   "to NaN, and a check of NaN against NaN fails)")
    g.add_argument("--adam-eps", type=positive_float, default=1e-6,
                   help="AdamW epsilon (1e-6: see docs/guide/simulate.md on fp32 checks)")
    p.add_argument("--allow-oversubscribe", action="store_true",
                   help="start even when the cost model says this host's free memory is "
                   "too small for every virtual device and the reference")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Validate everything, then simulate and print; exit 1 when a check fails."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    import torch

    from shardlab.nn.data import batches
    from shardlab.nn.moe import MoEOptions
    from shardlab.sim.footprint import MAX_DEVICES, run_peak_bytes
    from shardlab.sim.parallel import AdamWConfig, Parallel
    from shardlab.sim.run import layout_for, simulate_run

    vocab = garden_vocab().size
    shape_flags(args, f"MODEL ({args.model})" if args.model is not None else None)
    shape = build_shape(args, vocab)
    require_buildable(shape)
    if args.zero > 3:
        raise SpecError("zero", args.zero, "must be 0, 1, 2 or 3")
    if args.etp != 1:
        raise SpecError("etp", args.etp, "must be 1: the simulator keeps experts whole on "
                        "every tensor-parallel device")
    par = Parallel(dp=args.dp, tp=args.tp, pp=args.pp, zero=args.zero, sp=args.sp,
                   microbatches=args.microbatches, schedule=args.schedule, ep=args.ep,
                   cp=args.cp, stage_layers=parse_stage_layers(args.stage_layers),
                   dp_replicate=args.dp_replicate)
    moe = None
    if shape.moe is not None:
        moe = MoEOptions(aux_coef=args.aux_loss_coef, z_coef=args.router_z_loss,
                         capacity_factor=args.capacity_factor, routing=args.routing)
    elif args.routing != "learned":
        raise SpecError("routing", args.routing, "needs a mixture-of-experts model")
    link = None
    if args.link is not None:
        link = find("link", args.link, LINKS)
    global_batch = args.global_batch or args.dp * args.microbatches * 2
    if global_batch % (args.dp * args.microbatches):
        raise SpecError("global_batch", global_batch,
                        f"must be a multiple of dp x microbatches ({args.dp}x{args.microbatches})")
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    # Every layout check, before work (ep and the capacity factor of a dense model too).
    lay = layout_for(shape, par, global_batch, args.seq, dtype, args.capacity_factor)
    if lay.gpus > MAX_DEVICES:
        raise SpecError("devices", lay.gpus, f"dp x cp x tp x pp ({lay.dp} x {lay.cp} x "
                        f"{lay.tp} x {lay.pp}) must be <= {MAX_DEVICES}: one process runs "
                        "every virtual device in turn")
    check_host_memory(run_peak_bytes(shape, lay), 1, f"simulating {lay.gpus} virtual devices "
                      "and the one-device reference in this process", args.allow_oversubscribe)

    docs = garden_documents(max(200, 4 * global_batch * min(args.steps, DOC_STEPS)), args.seed)
    stream = itertools.islice(batches(docs, global_batch, args.seq, seed=args.seed), args.steps)
    with _progress(args.steps) as progress:
        result = simulate_run(shape, par, stream, dtype, args.seed,
                              AdamWConfig(lr=args.lr, eps=args.adam_eps), link, progress, moe)
    doc = result_doc(shape, result)
    if args.json:
        print_json(doc)
    else:
        print_simulation(doc)
    return 0 if result.passed else 1


@contextlib.contextmanager
def _progress(steps: int) -> Iterator[Callable[[int, str], None]]:
    """What :func:`~shardlab.sim.run.simulate_run` reports, on stderr (``--json`` keeps
    stdout to one document): a line per phase and per step, and a bar over the steps where
    stderr is a terminal."""
    console = Console(stderr=True, highlight=False)
    with Progress(TextColumn("simulating: step {task.completed}/{task.total}"), BarColumn(),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as bar:
        task = bar.add_task("", total=steps)

        def tell(done: int, line: str) -> None:
            prefix = f"step {done}/{steps}: " if done else ""
            bar.console.print(f"  {prefix}{line}", markup=False, soft_wrap=True)
            bar.update(task, completed=done)

        yield tell


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
        "routing_imbalance": r.routing_imbalance,
    }
