"""The page itself: escaping, the head a phone and the CSP need, writing whole or not at all."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest

from shardlab.errors import SpecError
from shardlab.report.html import (
    Raw,
    Section,
    check_figures_dir,
    check_output,
    page,
    para,
    table_html,
    verdict,
    write_atomic,
    write_report,
)

EVIL = '<script>alert("x")</script> & <img src=x onerror=y>'


def test_every_string_is_escaped() -> None:
    s = Section("s<1>", EVIL).add(para(EVIL), table_html((EVIL, "n"), [(EVIL, EVIL)],
                                                         caption=EVIL))
    html = page(EVIL, [EVIL], [s])
    assert "<script" not in html and "<img" not in html
    # title, h1, subtitle, nav link, h2, paragraph, header cell, two cells, caption
    assert html.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") == 10
    assert 'id="s&lt;1&gt;"' in html and 'href="#s&lt;1&gt;"' in html


def test_raw_cells_are_kept_and_numbers_right_aligned() -> None:
    t = table_html(("what", "value"), [("a", Raw(verdict(False))), ("b", 3)])
    assert '<td class="n"><span class="bad">FAIL</span></td>' in t
    assert '<td class="n">3</td>' in t and "<td>a</td>" in t


def test_head_has_viewport_csp_and_no_script() -> None:
    html = page("t", [], [Section("a", "A")])
    assert html.startswith("<!DOCTYPE html>")
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    assert "default-src &#x27;none&#x27;" in html  # the CSP forbids every fetch
    assert "<script" not in html and "http://" not in html and "https://" not in html


def test_check_output(tmp_path: Path) -> None:
    assert check_output(tmp_path / "a.html") == tmp_path / "a.html"
    with pytest.raises(SpecError, match="does not exist"):
        check_output(tmp_path / "missing" / "a.html")
    with pytest.raises(SpecError, match="not a folder"):
        check_output(tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(SpecError, match="permission"):
            check_output(ro / "a.html")


def test_check_figures_dir(tmp_path: Path) -> None:
    assert check_figures_dir(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "file").write_text("x")
    with pytest.raises(SpecError, match="a file is there"):
        check_figures_dir(tmp_path / "file")
    with pytest.raises(SpecError, match="parent folder"):
        check_figures_dir(tmp_path / "no" / "such")


def test_write_atomic_leaves_the_old_file_when_it_fails(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "r.html"
    target.write_text("old")

    def fail(src: str, dst: str) -> None:
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", fail)
        with pytest.raises(OSError, match="disk full"):
            write_atomic(target, b"new")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["r.html"]
    write_atomic(target, b"new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["r.html"]


def test_check_output_tries_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A read-only file system (errno 30) passes os.access for root: only trying tells.
    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    with monkeypatch.context() as m:
        m.setattr(tempfile, "mkstemp", read_only)
        with pytest.raises(SpecError, match=r"cannot be written \(Read-only file system\)"):
            check_output(tmp_path / "a.html", "svg")
        with pytest.raises(SpecError, match=r"figures=.*\(Read-only file system\)"):
            check_figures_dir(tmp_path / "figs")
    assert check_output(tmp_path / "a.html") == tmp_path / "a.html"
    assert os.listdir(tmp_path) == []  # the probe is gone


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["022", "077"])
def test_write_atomic_gives_the_umask_mode(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "r.html", b"page")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.html").stat().st_mode) == 0o666 & ~umask


def test_a_write_that_fails_after_the_check_is_one_spec_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The disk filled between the check and the write: one line naming the flag.
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(SpecError, match=r"output=.*No space left on device"):
        write_report(tmp_path / "r.html", "<p>")
    assert os.listdir(tmp_path) == []


def test_a_path_too_long_for_the_file_system_is_one_error() -> None:
    from shardlab.report.html import check_figures_dir, check_output

    with pytest.raises(SpecError, match=r"output=.*is not a usable path"):
        check_output("x" * 10_000)
    with pytest.raises(SpecError, match=r"figures=.*is not a usable path"):
        check_figures_dir("y" * 10_000)
