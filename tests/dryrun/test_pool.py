"""The dry-run pool: roles forked from the warm fork server, one fresh process per role,
results in order, and a failing role named by its rank. The roles here run a stdlib
function in place of a dry run (the pool resolves :data:`~shardlab.dryrun.pool.ROLE` in
the role's process), so the test costs the fork server's start, not dry runs."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from shardlab.dryrun import pool


@pytest.mark.multiprocess
def test_roles_fork_from_the_server_and_a_failing_rank_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []

    class Recorded(pool.ProcessPoolExecutor):
        def __init__(self, **kwargs: Any) -> None:
            made.append(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr(pool, "ProcessPoolExecutor", Recorded)
    # truediv(cfg, rank): a "role" whose result depends on its inputs, and that fails for
    # rank 0 (a division by zero) in its own process.
    monkeypatch.setattr(pool, "ROLE", "operator:truediv")
    torch_before = "torch" in sys.modules
    assert pool.run_many([(6.0, 3), (6.0, 2), (6.0, 1)], jobs=2) == [2.0, 3.0, 6.0]
    with pytest.raises(pool.RoleError, match=r"^rank 0: ZeroDivisionError: float division"):
        pool.run_many([(6.0, 3), (6.0, 0), (6.0, 2)], jobs=2)
    for kwargs in made:
        assert kwargs["mp_context"].get_start_method() == "forkserver"
        assert kwargs["max_tasks_per_child"] == 1  # a fresh process for every role
    assert len(made) == 2
    # The pool itself loaded no torch into the caller (the server and the roles may).
    assert ("torch" in sys.modules) == torch_before
