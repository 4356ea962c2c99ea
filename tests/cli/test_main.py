"""``shardlab.cli.main``: the last line of defence turns a path the file system refuses into
one line and exit 2; other OS errors are not hidden."""

from __future__ import annotations

import errno

import pytest

from shardlab.cli import main


def test_a_path_the_file_system_refuses_is_one_line(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    code = main(["report", "run", "x" * 10_000])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("shardlab report: error:") and "File name too long" in err
    assert len(err) < 300  # the path is cut


def test_other_os_errors_go_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardlab.cli import catalogs

    def broken(_: object) -> int:
        raise OSError(errno.EIO, "Input/output error", "/some/file")

    monkeypatch.setattr(catalogs, "run_models", broken)
    with pytest.raises(OSError, match="Input/output error"):
        main(["models"])
