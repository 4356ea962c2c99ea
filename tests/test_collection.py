"""pytest collects every test file: run on tests/, it collects tests from every
``test_*.py`` file under it. A folder that a default skips (pytest's ``norecursedirs``
holds ``dist`` and ``build``, which once hid the 66 tests of tests/dist) would be
missing from what it collects.

About 8 s: one collection of the whole suite in a fresh interpreter (it imports every
test module, torch and transformers among them)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def collect(*args: str) -> set[str]:
    """The node ids ``pytest --collect-only`` prints for ``args``."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                        "-p", "no:cacheprovider", *args], cwd=TESTS.parent,
                       capture_output=True, text=True, timeout=240, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {line for line in r.stdout.splitlines() if "::" in line}


def test_every_test_file_is_collected() -> None:
    files = sorted(str(p.relative_to(TESTS.parent)) for p in TESTS.rglob("test_*.py"))
    by_folder = collect("tests")
    seen = {re.split("::", node)[0] for node in by_folder}
    assert seen == set(files), set(files) - seen
