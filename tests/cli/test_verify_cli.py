"""``shardlab verify`` end to end: every experiment at world sizes 2 and 4, a fault, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from shardlab.cli import main
from shardlab.verify.registry import EXPERIMENTS


def shardlab(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardlab", *argv], capture_output=True,
                          text=True, timeout=timeout)


# tests/verify runs these at 4 ranks already; the 4-rank CLI run covers the others.
AT_FOUR_ELSEWHERE = {"fsdp2", "tensor_parallel", "dtensor"}


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [2, 4])
def test_every_experiment_passes(world: int) -> None:
    wanted = set(EXPERIMENTS) - (AT_FOUR_ELSEWHERE if world == 4 else set())
    r = shardlab("verify", "--world-size", str(world), "--json",
                 *(["--only", ",".join(sorted(wanted))] if world == 4 else []))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(r.stdout)  # one document, nothing else on stdout
    assert doc["world_size"] == world and doc["backend"] == "gloo" and doc["passed"]
    assert set(doc) >= {"checks", "world_size", "torch_version", "backend", "elapsed_s"}
    ran = {c["name"].split(".")[0] for c in doc["checks"]}
    assert ran == wanted
    assert all(set(c) >= {"name", "value", "tolerance", "passed"} for c in doc["checks"])


@pytest.mark.multiprocess
def test_a_fault_on_rank_1_ends_the_run_quickly() -> None:
    start = time.monotonic()
    r = shardlab("verify", "--world-size", "2", "--only", "tp_algebra,precision",
                 "--inject-fault", "1", "--timeout", "20")
    assert time.monotonic() - start < 30
    assert r.returncode == 1 and r.stdout == ""
    assert "rank 1 failed" in r.stderr and "fault injected on rank 1" in r.stderr


@pytest.mark.parametrize(("argv", "words"), [
    (["--world-size", "1"], "world_size=1"),
    (["--world-size", "3"], "world_size=3"),
    (["--world-size", "0"], "--world-size"),
    (["--only", "fsdp2,nonsense"], "nonsense"),
    (["--timeout", "-1"], "--timeout"),
])
def test_bad_input_starts_nothing(capsys: pytest.CaptureFixture[str], argv: list[str],
                                  words: str) -> None:
    start = time.monotonic()
    try:
        code = main(["verify", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err
    assert time.monotonic() - start < 2  # no process was started
