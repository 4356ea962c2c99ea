"""OutputFolder: a new or empty folder written all at once, never half."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardlab.errors import SpecError
from shardlab.hf.folder import OutputFolder


def test_files_appear_only_when_complete(tmp_path: Path) -> None:
    folder = OutputFolder(tmp_path / "out")
    with folder as tmp:
        (tmp / "a.txt").write_text("a")
        assert not (tmp_path / "out").exists() and tmp.parent == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (tmp_path / "out" / "a.txt").read_text() == "a"


def test_any_failure_removes_the_temporary(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), OutputFolder(tmp_path / "out") as tmp:
        (tmp / "a.txt").write_text("a")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_folder_filled_meanwhile_is_not_overwritten(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="was created while this ran"), \
            OutputFolder(tmp_path / "out") as tmp:
        (tmp / "a.txt").write_text("a")
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "theirs.txt").write_text("theirs")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["theirs.txt"]


def test_a_symlink_to_an_empty_folder_is_filled_where_it_points(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with OutputFolder(tmp_path / "link") as tmp:
        (tmp / "a.txt").write_text("a")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "a.txt").is_file()


def test_an_unwritable_parent_is_refused_before_any_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (the suite may run as root, which access(2) lets write anywhere: stand in for it)
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(SpecError, match="cannot be written"):
        OutputFolder(tmp_path / "out")


def test_names_at_the_file_system_limit(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot be used: File name too long"):
        OutputFolder(tmp_path / ("x" * 300))
    with OutputFolder(tmp_path / ("y" * 250)) as tmp:  # the temporary's name must fit too
        (tmp / "a.txt").write_text("a")
    assert [p.name for p in tmp_path.iterdir()] == ["y" * 250]
