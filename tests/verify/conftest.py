"""Shared by the experiment tests: launch one experiment and hold every rank's checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shardlab.dist.launch import launch

Runner = Callable[[str, int, Path, set[str]], list[list[dict]]]


@pytest.fixture
def run_everywhere() -> Runner:
    """``run(module, world_size, work_dir, expected_names)``: launch
    ``shardlab.verify.<module>:run``; assert every rank returned at least the expected
    checks, in the same order, all passed; return the checks by rank."""

    def run(module: str, world_size: int, work_dir: Path,
            expected: set[str]) -> list[list[dict]]:
        results = launch(f"shardlab.verify.{module}:run", world_size, (str(work_dir),),
                         timeout_s=60)
        assert len(results) == world_size
        for rank, checks in enumerate(results):
            names = {c["name"] for c in checks}
            assert expected <= names, (rank, expected - names)
            failed = [c for c in checks if not c["passed"]]
            assert not failed, f"rank {rank}: {failed}"
        assert [c["name"] for c in results[0]] == [c["name"] for c in results[-1]]
        return results

    return run
