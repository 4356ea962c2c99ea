"""``shardlab demo``: bad input refused before any work (the whole demo runs once, in
tests/report/test_demo.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def demo(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    # A fresh SHARDLAB_HOME: the demo measures this CPU itself, and writes nothing in ~.
    env = {**os.environ, "SHARDLAB_HOME": str(cwd / "home")}
    return subprocess.run([sys.executable, "-m", "shardlab", "demo", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_bad_output_path_stops_it_first(tmp_path: Path) -> None:
    r = demo(tmp_path, "-o", str(tmp_path / "no" / "r.html"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("shardlab demo: error: output=") and r.stderr.count("\n") == 1
    assert os.listdir(tmp_path) == []


def test_an_old_run_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text("{}")
    r = demo(tmp_path, "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2 and "already holds a run" in r.stderr and r.stdout == ""
