"""``shardlab models`` and ``shardlab hardware``: the catalogs, with their sources."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shardlab.cli.args import positive_float, positive_int
from shardlab.cli.output import print_json
from shardlab.config.catalog import MODELS
from shardlab.config.hardware import ACCELERATORS, LINKS
from shardlab.config.hardware_file import load_hardware_file
from shardlab.config.measured import load_measurement, measurement_path
from shardlab.errors import SpecError
from shardlab.estimate.params import count_params
from shardlab.report.catalog_view import print_hardware, print_models
from shardlab.report.measure_view import measure_progress, print_measurement


def register(sub: Any) -> None:
    """Add the ``models`` and ``hardware`` sub-commands."""
    p = sub.add_parser("models", help="list the model catalog",
                       description="The model catalog: shapes, exact parameter counts, sources.")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run_models)
    p = sub.add_parser("hardware", help="list accelerators and links; --measure this CPU",
                       description="Accelerators (dense peaks) and links, with sources. "
                       "--measure times this machine's CPU with torch (matmul FLOP/s in fp32 "
                       "and bf16, memory copy bandwidth) and stores it in $SHARDLAB_HOME/"
                       "cpu.json (default ~/.cache/shardlab/cpu.json); later commands can then "
                       "use it as the accelerator \"cpu\".")
    p.add_argument("--hardware-file", type=Path, help="TOML file of extra accelerators/links")
    p.add_argument("--measure", action="store_true",
                   help="measure this machine's CPU with torch and store the result")
    p.add_argument("--seconds", type=positive_float, default=None,
                   help="time budget of --measure's in-process phases in seconds (default 6; "
                   "each phase has its share, on any CPU)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads for --measure (default: torch's setting)")
    p.add_argument("--no-runtime", action="store_true",
                   help="--measure without the 2-rank part (gloo's collective rates and "
                   "the runtime's fixed costs per parallel style, about 13 s more)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run_hardware)


def run_models(args: argparse.Namespace) -> int:
    """Print the model catalog."""

    rows = [{"name": m.name, **{k: v for k, v in asdict(m).items() if k != "name"},
             "params": count_params(m).total,
             "active_params": count_params(m).active_per_token} for m in MODELS.values()]
    if args.json:
        print_json({"models": rows})
        return 0

    print_models(rows)
    return 0


def run_hardware(args: argparse.Namespace) -> int:
    """Print the accelerator and link catalogs (plus a user file's entries, plus a stored
    CPU measurement); with ``--measure``, measure this CPU and store it instead."""
    if args.measure:
        return run_measure(args)
    for flag, value in (("--seconds", args.seconds), ("--threads", args.threads),
                        ("--no-runtime", args.no_runtime or None)):
        if value is not None:
            raise SpecError(flag, value, "only goes with --measure")

    accels, links = (load_hardware_file(args.hardware_file) if args.hardware_file
                     else (ACCELERATORS, LINKS))
    accels, links = dict(accels), dict(links)
    measured = load_measurement()
    if measured is not None:
        accels[measured.name] = measured
        links[measured.intra_link.name] = measured.intra_link
    doc = {"accelerators": [asdict(a) for a in accels.values()],
           "links": [asdict(k) for k in links.values()]}
    if args.json:
        print_json(doc)
        return 0

    print_hardware(doc)
    return 0


def run_measure(args: argparse.Namespace) -> int:
    """Measure this CPU (``shardlab.calibrate.runtime.measure_machine``) with a progress
    line per phase on stderr, store it atomically, print the figures. Ctrl-C stores
    nothing (the previous measurement stays as it was) and exits 130 with one line."""
    if args.hardware_file is not None:
        raise SpecError("--hardware-file", str(args.hardware_file),
                        "does not go with --measure")


    if importlib.util.find_spec("torch") is None:
        raise SpecError("--measure", "torch", "needs torch: pip install 'shardlab[torch]'")
    # Measuring runs torch and launches ranks: imported here, so listing the catalogs
    # (shardlab hardware) stays torch-free.
    from shardlab.calibrate.cpu import BUDGET_SHARES
    from shardlab.calibrate.runtime import measure_machine
    from shardlab.calibrate.store import save_measurement

    try:
        with measure_progress(len(BUDGET_SHARES) + (not args.no_runtime)) as phases:
            doc = measure_machine(seconds=args.seconds, threads=args.threads,
                                  runtime=not args.no_runtime, phases=phases)
    except KeyboardInterrupt:
        sys.stderr.write(f"shardlab hardware: interrupted: nothing stored, "
                         f"{measurement_path()} is as it was\n")
        return 130
    path = save_measurement(doc)
    if args.json:
        print_json({**doc, "path": str(path)})
        return 0
    print_measurement(doc, str(path))
    return 0
