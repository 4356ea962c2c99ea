"""pytest collects every test file: run on tests/, it collects tests from every
``test_*.py`` file under it. A folder that a default skips (pytest's ``norecursedirs``
holds ``dist`` and ``build``, which once hid the 66 tests of tests/dist) would be
missing from what it collects.

When this session itself collected the whole suite (``make test``: pytest on its
``testpaths``), its collection is checked as it is (``tests/conftest.py`` keeps the node
ids). Otherwise (a single file, a folder) the suite is collected again in a fresh
interpreter: about 8-12 s, as it imports every test module, torch and transformers among
them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import COLLECTED

TESTS = Path(__file__).resolve().parent


def collect(*args: str) -> set[str]:
    """The node ids ``pytest --collect-only`` prints for ``args``."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                        "-p", "no:cacheprovider", *args], cwd=TESTS.parent,
                       capture_output=True, text=True, timeout=240, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {line for line in r.stdout.splitlines() if "::" in line}


def whole_suite(config: pytest.Config) -> bool:
    """Whether this session was started on the whole of tests/ (its arguments, resolved,
    are tests/ or the project's root)."""
    root = TESTS.parent
    args = [Path(config.invocation_params.dir, a.split("::")[0]).resolve()
            for a in config.args]
    return bool(args) and all(a in (TESTS, root) for a in args)


def test_every_test_file_is_collected(request: pytest.FixtureRequest) -> None:
    files = sorted(str(p.relative_to(TESTS.parent)) for p in TESTS.rglob("test_*.py"))
    config = request.config
    nodes = config.stash[COLLECTED] if whole_suite(config) else collect("tests")
    seen = {re.split("::", node)[0] for node in nodes}
    assert seen == set(files), set(files) - seen
