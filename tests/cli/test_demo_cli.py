"""``shardlab demo``: bad input refused before any work (the whole demo runs once, in
tests/report/test_demo.py); and ``shardlab`` with no command, which points to it and the rest."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from shardlab.cli import build_parser, main


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing may be measured or stored in ~ by a refused demo.
    monkeypatch.setenv("SHARDLAB_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


def test_a_bad_output_path_stops_it_first(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "-o", str(tmp_path / "no" / "r.html")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("shardlab demo: error: output=")
    assert err.count("\n") == 1 and os.listdir(tmp_path) == []


def test_an_old_run_directory_is_refused(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text("{}")
    assert main(["demo", "--run-dir", str(tmp_path / "run")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "already holds a run" in err and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["run"]


@pytest.mark.parametrize(("where", "message"), [
    ("file/run", "cannot be made: {tmp}/file is a file"),
    ("file", "is a file; --run-dir needs a folder"),
])
def test_a_run_directory_training_would_refuse_stops_it_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, message: str) -> None:
    # Refused before the budget, the plan and measuring this CPU, not after them.
    (tmp_path / "file").write_text("x")
    assert main(["demo", "--run-dir", str(tmp_path / where)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"shardlab demo: error: run-dir='{tmp_path / where}': "
                                        f"{message.format(tmp=tmp_path)}")
    assert err.count("\n") == 1 and sorted(os.listdir(tmp_path)) == ["file"]


def test_no_command_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    names = list(sub.choices)
    assert len(names) == len(set(names)) == 15
    assert {"demo", "report", "plan", "launch", "data", "dryrun", "export", "import"} <= set(names)
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"shardlab: error: a command is required ({', '.join(names)}); "
                                 "see shardlab --help\n")
