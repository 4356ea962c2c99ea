"""Shared by the experiment tests: every experiment they need at a world size runs in one
launch (the runner, as ``shardlab verify`` runs them), once for the session, so the few
seconds of rank start-up are paid once per world size; each test reads its experiment."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardlab.distributed.launch import launch

# What tests/verify runs at each world size (registry names), in one launch each.
AT = {
    2: ["gloo_avg", "fsdp2", "checkpoint", "tensor_parallel", "dtensor", "pipelining",
        "ddp_token_weighting", "activation_checkpointing", "tp_algebra", "precision"],
    4: ["fsdp2", "tensor_parallel", "dtensor"],
}

Ran = tuple[list[dict[str, Any]], Path]  # every rank's {experiment: {checks, seconds}}, work dir
Runner = Callable[[str, int, set[str]], tuple[list[list[dict]], Path]]


@pytest.fixture(scope="session")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Ran]:
    """``at(world_size)``: the launch of ``AT[world_size]``'s experiments, run on first use."""
    done: dict[int, Ran] = {}

    def at(world_size: int) -> Ran:
        if world_size not in done:
            work = tmp_path_factory.mktemp(f"verify-{world_size}")
            per_rank = launch("shardlab.verify.runner:run_experiments", world_size,
                              (AT[world_size], str(work)), timeout_s=60)
            assert len(per_rank) == world_size
            done[world_size] = (per_rank, work)
        return done[world_size]

    return at


@pytest.fixture
def run_everywhere(launched: Callable[[int], Ran]) -> Runner:
    """``run(name, world_size, expected_names)``: experiment ``name``'s checks by rank from
    the launch at that world size, and the folder it was given; asserts every rank
    returned at least the expected checks, in the same order, all passed."""

    def run(name: str, world_size: int, expected: set[str]) -> tuple[list[list[dict]], Path]:
        per_rank, work = launched(world_size)
        results = [r[name]["checks"] for r in per_rank]
        for rank, checks in enumerate(results):
            names = {c["name"] for c in checks}
            assert expected <= names, (rank, expected - names)
            failed = [c for c in checks if not c["passed"]]
            assert not failed, f"rank {rank}: {failed}"
        assert [c["name"] for c in results[0]] == [c["name"] for c in results[-1]]
        return results, work / name

    return run
