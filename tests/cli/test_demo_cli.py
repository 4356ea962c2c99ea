"""``shardlab demo``: bad input refused before any work (the whole demo runs once, in
tests/report/test_demo.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardlab.cli import main


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
