"""``shardlab report``: one self-contained HTML page per question (budget, plan, run,
dryrun).

Everything the page needs is computed and drawn before anything is written; the page
(and, with ``--figures``, each chart as SVG and PNG) is then written whole and renamed
into place. Bad input (an unknown model, a folder that is no run, a file that is no dry
run's document, an output path that cannot be written) is one line and exit code 2, with
nothing written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from shardlab.cli import dryrun
from shardlab.cli.args import Parser
from shardlab.cli.budget import (
    add_assumption_args,
    add_cluster_args,
    add_hardware_args,
    add_layout_args,
    apply_cluster_args,
    assumptions_from,
    model_and_layout,
)
from shardlab.cli.plan import add_plan_args, plan_document
from shardlab.config.measured import accelerator_or_measured
from shardlab.errors import SpecError


def _add_output_args(p: argparse.ArgumentParser, default: str, shown: str = "") -> None:
    p.add_argument("-o", "--output", default=default,
                   help=f"the HTML file to write (default {shown or default})")
    p.add_argument("--figures", type=Path, metavar="DIR",
                   help="also write every chart as DIR/NAME.svg and DIR/NAME.png")


class _Into:
    """A stand-in for ``add_subparsers()`` that hands ``dryrun.register`` the report kind's
    own parser, so ``report dryrun`` takes exactly the flags of ``shardlab dryrun``."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add_parser(self, *_: Any, **__: Any) -> argparse.ArgumentParser:
        return self.parser


def register(sub: Any) -> None:
    """Add the ``report`` sub-command and its kinds: budget, plan, run, dryrun."""

    p = sub.add_parser("report", help="one self-contained HTML page: budget, plan, run or "
                       "dryrun",
                       description="Draw a budget, a plan, a training run or a dry run as one "
                       "HTML file that needs no network (inline SVG charts and CSS).")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", parser_class=Parser, required=True)

    b = kinds.add_parser("budget", help="parameters, memory per ZeRO stage and recompute mode, "
                         "FLOPs and days, roofline, serving",
                         description="The budget of MODEL on a layout, drawn.")
    b.add_argument("model", help="catalog name or path to a Hugging Face config.json")
    add_layout_args(b)
    add_hardware_args(b)
    add_cluster_args(b)
    add_assumption_args(b)
    _add_output_args(b, "budget-report.html")
    b.set_defaults(run=run_budget)

    pl = kinds.add_parser("plan", help="the ranked layouts, their step time, rejections, and "
                          "the winner's pipeline timeline",
                          description="Search the layouts as `shardlab plan` does, drawn.")

    add_plan_args(pl)
    _add_output_args(pl, "plan-report.html")
    pl.set_defaults(run=run_plan)

    r = kinds.add_parser("run", help="loss curves, tokens/s and MFU, predicted vs measured, "
                         "memory per rank of a `shardlab train` run",
                         description="Draw a training run from its directory (--log-dir), or "
                         "from its step log alone (train.jsonl: a run still training, or "
                         "stopped).")
    r.add_argument("run_dir", metavar="RUN_DIR", help="the folder `shardlab train --log-dir` "
                   "wrote (report.json, train.jsonl), or a train.jsonl file")
    _add_output_args(r, "", "RUN_DIR/report.html")
    r.set_defaults(run=run_run)

    d = kinds.add_parser("dryrun", help="memory per role, the cost model beside the dry run, "
                         "of a `shardlab dryrun`",
                         description="Draw a dry run: from a saved `shardlab dryrun --json` "
                         "document (--from FILE), or dry-run first, with the flags of "
                         "`shardlab dryrun`.")
    d.add_argument("--from", dest="from_file", metavar="FILE",
                   help="a document `shardlab dryrun --json` wrote ('-': standard input), "
                   "instead of MODEL --gpus N ...")
    ours = {a.dest for a in d._actions}
    dryrun.register(_Into(d))
    live = [a for a in d._actions if a.dest not in ours]  # the flags of `shardlab dryrun`
    for action in live:  # argparse has no public way to change a flag once added
        if action.dest == "gpus":
            action.required = False  # --from needs none; run_dryrun asks for it otherwise
        elif action.dest == "json":
            action.help = argparse.SUPPRESS  # refused: the report writes HTML
    _add_output_args(d, "dryrun-report.html")
    # Each dry-run flag's default, to tell one given beside --from (refused, not ignored).
    d.set_defaults(run=run_dryrun, live_defaults={a.dest: d.get_default(a.dest)
                                                  for a in live if a.dest != "json"})


def _outputs(args: argparse.Namespace) -> tuple[Path, Path | None]:
    # Imported here: the HTML reports load matplotlib, which other commands' start must not pay.
    from shardlab.report.html import check_figures_dir, check_output

    out = check_output(args.output)
    figures = check_figures_dir(args.figures) if args.figures is not None else None
    return out, figures


def _write(title: str, subtitle: list[str], sections: list[Any], out: Path,
           figures: Path | None) -> int:
    # Imported here: the HTML reports load matplotlib, which other commands' start must not pay.
    from shardlab.report.html import page, write_report

    charts = [c for s in sections for c in s.charts]
    text = page(title, subtitle, sections)
    written = write_report(out, text, charts, figures)
    sys.stdout.write(f"wrote {out} ({len(text.encode()) / 1000:.0f} kB, {len(charts)} charts)"
                     + (f"; {len(written)} figure files in {figures}" if figures else "") + "\n")
    return 0


def run_budget(args: argparse.Namespace) -> int:
    """``shardlab report budget``."""

    out, figures = _outputs(args)
    acc = apply_cluster_args(accelerator_or_measured(args.gpu, args.hardware_file), args)
    model, layout = model_and_layout(args)
    title, subtitle, sections = budget_page(model, layout, acc, assumptions_from(args))
    return _write(title, subtitle, sections, out, figures)


def budget_page(model: Any, layout: Any, acc: Any, a: Any, prefix: str = "budget"
                ) -> tuple[str, list[str], list[Any]]:
    """Title, subtitle lines and sections of a budget page."""
    # Imported here: the HTML reports load matplotlib, which other commands' start must not pay.
    from shardlab.report.budget_html import budget_sections

    doc, sections = budget_sections(model, layout, acc, a, prefix)
    title = f"Budget: {model.name} on {layout.gpus} x {acc.name}"
    return title, [doc["model"]["describe"], doc["layout"]["describe"]], sections


def run_plan(args: argparse.Namespace) -> int:
    """``shardlab report plan``."""
    # Imported here: the HTML reports load matplotlib, which other commands' start must not pay.
    from shardlab.report.plan_html import plan_sections

    out, figures = _outputs(args)
    doc = plan_document(args)
    title = f"Plan: {doc['model']} on {doc['gpus']} x {doc['gpu']}"
    return _write(title, [f"seq {doc['seq']}, global batch {doc['global_batch']}"],
                  plan_sections(doc), out, figures)


def run_run(args: argparse.Namespace) -> int:
    """``shardlab report run``."""
    # Imported here: the HTML reports load matplotlib, which other commands' start must not pay.
    from shardlab.report.run_html import load_run, run_sections

    run = load_run(args.run_dir)
    if not args.output:
        args.output = str(Path(run["dir"], "report.html"))
    out, figures = _outputs(args)
    doc = run["doc"]
    own = {Path(run["dir"], "report.json").resolve(), Path(run["log"]).resolve()}
    if out.resolve() in own:
        raise SpecError("output", args.output, "would overwrite the run's own data")
    if doc is None:
        return _write("Run: step log", [run["log"]], run_sections(run), out, figures)
    return _write(f"Run: {doc['layout']}", [doc["model"]], run_sections(run), out, figures)


def run_dryrun(args: argparse.Namespace) -> int:
    """``shardlab report dryrun``: from ``--from FILE``, or dry-run first."""
    # Imported here: the HTML reports load matplotlib, which other commands' start must not pay.
    from shardlab.report.dryrun_html import (
        check_document,
        dryrun_sections,
        dryrun_title,
        load_dryrun,
    )

    if args.json:
        raise SpecError("json", True, "the report writes HTML; `shardlab dryrun --json` "
                        "prints the document")
    given = [f for f, default in args.live_defaults.items() if getattr(args, f) != default]
    if args.from_file is not None and given:
        flag = given[0]
        raise SpecError(flag, getattr(args, flag), "cannot be combined with --from, a dry run "
                        "already made; leave it out")
    if args.from_file is None and args.gpus is None:
        raise SpecError("gpus", None, "is required: MODEL --gpus N [--layout ...] dry-runs "
                        "first, or --from FILE reads a saved `shardlab dryrun --json`")
    out, figures = _outputs(args)  # before a dry run of minutes
    if args.from_file is not None:
        doc = load_dryrun(args.from_file)
    else:
        # Imported here: torch loads only when a dry run is asked for.
        from shardlab.dryrun.pool import RoleError
        try:
            doc = check_document(dryrun.dryrun_document(args), "(the dry run just made)")
        except RoleError as e:
            sys.stderr.write(f"shardlab report: {e}\n")
            return 1
    title, subtitle = dryrun_title(doc)
    return _write(title, subtitle, dryrun_sections(doc), out, figures)
