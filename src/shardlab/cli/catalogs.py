"""``shardlab models`` and ``shardlab hardware``: the catalogs, with their sources."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shardlab.cli.output import print_json


def register(sub: Any) -> None:
    """Add the ``models`` and ``hardware`` sub-commands."""
    p = sub.add_parser("models", help="list the model catalog",
                       description="The model catalog: shapes, exact parameter counts, sources.")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run_models)
    p = sub.add_parser("hardware", help="list accelerators and links",
                       description="Accelerators (dense peaks) and links, with sources.")
    p.add_argument("--hardware-file", type=Path, help="TOML file of extra accelerators/links")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run_hardware)


def run_models(args: argparse.Namespace) -> int:
    """Print the model catalog."""
    from shardlab.estimate.params import count_params
    from shardlab.spec.catalog import MODELS

    rows = [{"name": m.name, **{k: v for k, v in asdict(m).items() if k != "name"},
             "params": count_params(m).total,
             "active_params": count_params(m).active_per_token} for m in MODELS.values()]
    if args.json:
        print_json({"models": rows})
        return 0
    from shardlab.report.catalog_view import print_models

    print_models(rows)
    return 0


def run_hardware(args: argparse.Namespace) -> int:
    """Print the accelerator and link catalogs (plus a user file's entries)."""
    from shardlab.spec.hardware import ACCELERATORS, LINKS, load_hardware_file

    accels, links = (load_hardware_file(args.hardware_file) if args.hardware_file
                     else (ACCELERATORS, LINKS))
    doc = {"accelerators": [asdict(a) for a in accels.values()],
           "links": [asdict(k) for k in links.values()]}
    if args.json:
        print_json(doc)
        return 0
    from shardlab.report.catalog_view import print_hardware

    print_hardware(doc)
    return 0
