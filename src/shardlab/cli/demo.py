"""``shardlab demo``: the whole tool in a few minutes, on this machine, with nothing downloaded.

1. the budget of a hypothetical 100B model on 1024 H100s (the seed question);
2. a plan for a small model on this machine's 2 processes (its CPU measured once, if it
   has not been);
3. the winning layout trained for real on 2 processes, checked against one process;
4. what the planner and the cost model predicted beside what the run measured;
5. one HTML page with all three (budget, plan, run), whose path it prints.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shardlab.cli.args import Parser, positive_float, positive_int
from shardlab.cli.budget import (
    add_assumption_args,
    add_hardware_args,
    add_layout_args,
    assumptions_from,
    model_and_layout,
)
from shardlab.cli.plan import add_plan_args, plan_document
from shardlab.config.measured import accelerator_or_measured, load_measurement
from shardlab.errors import SpecError
from shardlab.estimate.budget import model_budget
from shardlab.report.budget_view import print_budget
from shardlab.report.measure_view import measure_progress
from shardlab.report.plan_view import print_plan
from shardlab.report.tables import show, table
from shardlab.train.folders import check_folder

BUDGET_ARGS = ["hypo-100b", "--gpus", "1024", "--tp", "8", "--pp", "8", "--zero", "1",
               "--recompute", "selective"]
PLAN_ARGS = ["--gpu", "cpu", "--gpus", "2", "--global-batch", "8"]


def register(sub: Any) -> None:
    """Add the ``demo`` sub-command."""
    p = sub.add_parser("demo", help="budget, plan, a real 2-process run and its report",
                       description="Walk through shardlab: the 100B budget, a plan on this "
                       "machine, a real 2-process training run of the plan checked against "
                       "one process, predicted vs measured, and one HTML report.")
    p.add_argument("-o", "--output", default="demo-report.html",
                   help="the HTML report to write (default demo-report.html)")
    p.add_argument("--steps", type=positive_int, default=20, help="training steps")
    p.add_argument("--measure-seconds", type=positive_float, default=None,
                   help="budget of the CPU measurement's in-process phases when this CPU "
                   "has not been measured yet (default 6, as shardlab hardware --measure)")
    p.add_argument("--run-dir", help="where the training run writes (default: a new "
                   "temporary folder)")
    p.set_defaults(run=run)


def _step(n: int, title: str) -> None:
    show("", f"[bold reverse] {n}/5 [/bold reverse] [bold]{title}[/bold]")


def _parse(add_args: Any, argv: list[str]) -> argparse.Namespace:
    p = Parser(prog="shardlab demo")
    add_args(p)
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    """Run the five steps; exit 0 when the run trained and matched one process."""
    # Imported here: the HTML reports load matplotlib, which other commands' start must not pay.
    from shardlab.report.html import check_output

    start = time.perf_counter()
    out = check_output(args.output)
    # A run folder that training would refuse is refused now, not after the budget, the plan
    # and measuring this CPU.
    check_folder("run-dir", args.run_dir)
    if args.run_dir and (Path(args.run_dir) / "report.json").exists():
        # A failed run would leave it to be read as new.
        raise SpecError("run-dir", args.run_dir, "already holds a run (report.json); give a "
                        "new folder")
    run_dir = Path(args.run_dir) if args.run_dir else _new_run_dir()

    budget = _budget()
    plan, winner = _plan(args.measure_seconds)
    code, run = _train(winner, args.steps, run_dir)
    if run is None:
        return code
    _compare(run, winner)
    _report(out, budget, plan, run)

    show("", f"[bold]report[/bold]: {out.resolve()}  (open it in a browser; one file, no "
         "network needed)", f"demo finished in {time.perf_counter() - start:.0f} s")
    return code


def _new_run_dir() -> Path:
    """A fresh folder for the training run under the system's temporary folder."""
    try:
        return Path(tempfile.mkdtemp(prefix="shardlab-demo-"))
    except OSError as e:
        raise SpecError("run-dir", tempfile.gettempdir(), f"cannot hold a new run folder "
                        f"({e.strerror or e}); give --run-dir") from None


def _budget() -> tuple[Any, ...]:
    _step(1, "What does a 100B-parameter model take?  shardlab budget " + " ".join(BUDGET_ARGS))

    def flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("model")
        add_layout_args(p)
        add_hardware_args(p)
        add_assumption_args(p)

    a = _parse(flags, BUDGET_ARGS)
    model, layout = model_and_layout(a)
    acc = accelerator_or_measured(a.gpu, a.hardware_file)
    assumptions = assumptions_from(a)
    print_budget(model_budget(model, layout, acc, assumptions))
    return model, layout, acc, assumptions


def _plan(measure_seconds: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.calibrate.cpu import BUDGET_SHARES
    from shardlab.calibrate.runtime import measure_machine
    from shardlab.calibrate.store import save_measurement

    _step(2, "Which layout trains a small model fastest on this machine's 2 processes?  "
          "shardlab plan " + " ".join(PLAN_ARGS))
    if load_measurement() is None:
        # The planner and MFU need this CPU's peak; measuring takes a few seconds, once.
        show("this CPU has not been measured yet: measuring its matmul peak, memory "
             "bandwidth, gloo's collectives and the runtime's fixed costs per parallel style "
             "(about 20 s on any CPU, stored for next time) ...")
        with measure_progress(len(BUDGET_SHARES) + 1) as phases:
            doc = measure_machine(measure_seconds, phases=phases)
        path = save_measurement(doc)
        show(f"  stored in {path}")
    doc = plan_document(_parse(add_plan_args, PLAN_ARGS))
    print_plan(doc)
    if not doc["best"] or not doc["best"][0].get("train_command"):
        raise SpecError("plan", "cpu", "found no layout to train on this machine")
    return doc, doc["best"][0]


def _train(winner: dict[str, Any], steps: int, run_dir: Path
           ) -> tuple[int, dict[str, Any] | None]:
    # Imported here: shardlab.cli imports this module to register it (a circle); the HTML
    # reports load matplotlib, which other commands' start must not pay.
    from shardlab.cli import main
    from shardlab.report.run_html import load_run

    argv = [*shlex.split(winner["train_command"])[1:], "--steps", str(steps),
            "--check-parity", "--log-dir", str(run_dir)]
    _step(3, "Train the winner for real on 2 processes, and the same model on one process:  "
          "shardlab " + shlex.join(argv))
    sys.stdout.flush()
    code = main(argv)
    if not (run_dir / "report.json").is_file():
        sys.stderr.write(f"shardlab demo: the training run failed (logs in {run_dir})\n")
        return code or 1, None
    return code, load_run(run_dir)


def _compare(run: dict[str, Any], winner: dict[str, Any]) -> None:
    # Imported here: the HTML reports load matplotlib, which other commands' start must not pay.
    from shardlab.report.run_html import comparison_rows

    _step(4, "Predicted (cost model and planner) vs measured (the run)")
    show(table("Predicted vs measured", ("what", "predicted", "measured", "measured/predicted"),
               comparison_rows(run["doc"], winner)))


def _report(out: Path, budget: tuple[Any, ...], plan: dict[str, Any],
            run: dict[str, Any]) -> None:
    # Imported here: the HTML reports load matplotlib, which other commands' start must not pay.
    from shardlab.report.budget_html import budget_sections
    from shardlab.report.html import page, write_report
    from shardlab.report.plan_html import plan_sections
    from shardlab.report.run_html import run_sections

    _step(5, "One report with all of it")
    _, b_sections = budget_sections(*budget, prefix="budget")
    sections = [*b_sections, *plan_sections(plan, prefix="plan"),
                *run_sections(run, prefix="run", plan=plan["best"][0])]
    model = budget[0]
    write_report(out, page("shardlab demo: budget, plan, run",
                           [f"budget: {model.name} on {budget[1].gpus} x {budget[2].name}",
                            f"plan and run: {plan['model_shape']} on {plan['gpus']} x "
                            f"{plan['gpu']}"], sections))
