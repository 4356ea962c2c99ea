"""``shardlab verify`` end to end: every experiment at world sizes 2 and 4, a fault, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardlab.verify.runner as runner
from shardlab.cli import guard, main
from shardlab.cli.verify import (
    RANK_RUNTIME_BYTES,
    largest_shapes,
    model_peak_bytes,
    rank_peak_bytes,
)
from shardlab.verify import fsdp2, tensor_parallel
from shardlab.verify.registry import EXPERIMENTS, GLOBAL_BATCH


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


class Launched(Exception):
    """The stand-in launcher was reached: every check before the ranks passed."""


def _no_launch(*_: object, **__: object) -> None:
    raise Launched


def verify_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["verify", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--host", "no such host!!", "host='no such host!!'"),
    ("--host", "", "host=''"),
    ("--log-dir", "{file}", "log_dir="),
    ("--log-dir", "{file}/sub", "log_dir="),
    ("--log-dir", "/proc/shardlab-verify-logs", "log_dir="),  # read-only, even for root
])
def test_bad_host_or_log_dir_is_one_line_before_any_rank(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        flag: str, value: str, words: str) -> None:
    if value.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    monkeypatch.setattr(runner, "launch", _no_launch)
    file = tmp_path / "a-file"
    file.write_text("")
    code, out, err = verify_main(capsys, flag, value.format(file=file))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert words in err and flag in err, err
    assert sorted(tmp_path.iterdir()) == [file] and file.read_text() == ""  # nothing written


def test_memory_guard_refuses_before_anything_is_made(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setattr(runner, "launch", _no_launch)
    # Three processes (two ranks and the launcher) of about 340 MiB do not fit in 0.9 GB.
    monkeypatch.setattr(guard, "available_memory_bytes", lambda: (1e9, "test"))
    logs = tmp_path / "logs"
    code, out, err = verify_main(capsys, "--log-dir", str(logs))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "memory=" in err and "x 3 " in err and "--allow-oversubscribe" in err, err
    assert not logs.exists()
    with pytest.raises(Launched):
        main(["verify", "--log-dir", str(logs), "--allow-oversubscribe"])
    assert logs.is_dir()  # made, as the launcher would, once every check passed


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_guard_takes_the_largest_experiment_model(world: int) -> None:
    largest = max(model_peak_bytes(s, GLOBAL_BATCH) for s in largest_shapes())
    for shape in (fsdp2.SHAPE, tensor_parallel.toy_shape(world)):  # left out: smaller
        assert model_peak_bytes(shape, GLOBAL_BATCH) < largest, shape.name
    extra = rank_peak_bytes(GLOBAL_BATCH) - RANK_RUNTIME_BYTES
    assert extra == largest and 0 < extra < RANK_RUNTIME_BYTES  # the interpreter dominates


@pytest.mark.multiprocess
@pytest.mark.parametrize(("sig", "code", "line"), [
    (signal.SIGINT, 130, "shardlab verify: interrupted"),
    (signal.SIGTERM, 143, "shardlab verify: terminated by SIGTERM; every rank stopped"),
])
def test_a_signal_stops_every_rank_with_one_line(tmp_path: Path, sig: int, code: int,
                                                 line: str) -> None:
    """The signal goes to the whole process group, as a terminal's Ctrl-C does, once every
    rank's log says it is up (past torch's import: a rank interrupted while Python imports
    torch prints that import's traceback before its output goes to its log, a known limit,
    docs/guide/verify.md): about 10 s of start-up each."""
    logs, tmp = tmp_path / "logs", tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "shardlab", "verify", "--only",
                             "fsdp2,checkpoint", "--log-dir", str(logs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + 120
        while sum("up (" in p.read_text() for p in logs.glob("*/attempt_0/*/stdout.log")) < 2:
            if proc.poll() is not None:  # ended before its ranks were up: say how
                out, err = proc.communicate()
                pytest.fail(f"verify ended with {proc.returncode} before its ranks were up:"
                            f"\n{err[-3000:]}\n{out[-2000:]}")
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code and out == ""
    assert err.splitlines() == [line], err
    for _ in range(100):  # no rank outlives the launcher
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("a process of the stopped job is still running")
    assert not list(tmp.glob("shardlab-verify-*"))  # the experiments' folder went with it
