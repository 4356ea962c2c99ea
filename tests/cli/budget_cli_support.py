"""What the ``shardlab budget`` CLI tests share: the Llama-3-8B config.json fixture,
running the CLI in-process or as a real process, and the one-line-error check.

Imported by ``test_budget_cli.py`` and ``test_budget_cli_bad_input.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardlab.cli import main

HF_DATA = Path(__file__).resolve().parents[1] / "config" / "data" / "hf"
LLAMA3_CONFIG = HF_DATA / "llama-3-8b.json"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``shardlab ARGV`` in-process: (exit code, stdout, stderr).

    argparse errors leave through SystemExit, SpecErrors through main's return value;
    both count. Any other exception propagates and fails the test, as it should.
    """
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    """Exit code 2, nothing on stdout, one line on stderr naming each needle, no traceback."""
    assert code == 2, (code, err)
    assert out == ""
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert len(err) < 300, f"a {len(err)}-character error line"  # long values are cut
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def shardlab_process(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``python -m shardlab ARGV`` in a fresh interpreter."""
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "shardlab", *argv], stderr=subprocess.PIPE,
                          text=True, timeout=60, check=False, **kw)
