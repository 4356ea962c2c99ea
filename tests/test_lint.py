"""ruff runs in the suite: a lint failure is a test failure."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests", "benchmarks"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_estimate_and_schedules_do_not_import_torch() -> None:
    code = ("import sys, shardlab.estimate.budget, shardlab.cli, shardlab.schedules.generators, "
            "shardlab.schedules.simulate, shardlab.schedules.closed_forms; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "importing the cost model or the schedules pulled in torch"
