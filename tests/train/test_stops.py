"""How a real ``shardlab train`` job stops: on Ctrl-C, or SIGINT or SIGTERM sent to the main
process alone, every rank is stopped and the command ends with one line and 130 or 143,
no rank left running and the checkpoint folder's lock released; at the first loss or
gradient norm that is not finite, every rank stops together and the command ends with
one line naming the step and exit 1.

Slow by nature (about 30-40 s a case on 2 shared cores): each case starts real ranks and
waits for rank 0's first logged step before signalling."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shardlab.cli import main
from shardlab.train.lock import LOCK_NAME

pytestmark = pytest.mark.multiprocess

TINY = ["--layers", "1", "--d-model", "16"]


def processes_with(marker: str) -> list[int]:
    """Pids of the processes (this one aside) whose environment holds ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in env:
            found.append(int(pid))
    return found


def wait_for_first_step(log: Path, job: subprocess.Popen[str], limit: float = 180) -> None:
    start = time.monotonic()
    while not (log.exists() and log.read_text().strip()):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() - start < limit, "no step logged"
        time.sleep(0.2)


@pytest.mark.parametrize(("how", "code", "line"), [
    ("ctrl-c", 130, "shardlab train: interrupted"),  # SIGINT to the whole process group
    ("sigint", 130, "shardlab train: interrupted"),  # to the main process alone
    ("sigterm", 143, "shardlab train: terminated by SIGTERM; every rank stopped"),
])
def test_a_signal_stops_every_rank(tmp_path: Path, how: str, code: int, line: str) -> None:
    marker = uuid.uuid4().hex
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    job = subprocess.Popen(
        [sys.executable, "-m", "shardlab", "train", *TINY, "--steps", "100000",
         "--log-dir", str(logs), "--checkpoint-dir", str(ckpt)],
        env={**os.environ, "SHARDLAB_TEST_MARKER": marker}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_first_step(logs / "train.jsonl", job)
        assert (ckpt / LOCK_NAME).exists()  # held while the job runs
        start = time.monotonic()
        if how == "ctrl-c":
            os.killpg(job.pid, signal.SIGINT)
        else:
            job.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == code and err.strip().splitlines() == [line], err[-3000:]
    assert time.monotonic() - start < 20  # before: the ranks trained 44 s more
    time.sleep(0.5)
    assert processes_with(marker) == []  # no rank left running
    assert not (ckpt / LOCK_NAME).exists()


def test_a_loss_that_is_not_finite_stops_every_rank(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # lr 1e9 diverges at the second or third step; in a pipeline (the loss is known on the
    # last stage only) with checkpoints every step, so no checkpoint of it is written.
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    code = main(["train", "--layers", "2", "--d-model", "16", "--pp", "2", "--lr", "1e9",
                 "--steps", "6", "--log-dir", str(logs), "--checkpoint-dir", str(ckpt),
                 "--checkpoint-every", "1", "--json"])
    out, err = capsys.readouterr()
    records = [json.loads(x) for x in (logs / "train.jsonl").read_text().splitlines()]
    bad = next(r for r in records if not (math.isfinite(r["loss"])
                                          and math.isfinite(r["grad_norm"])))
    assert code == 1 and out == "" and records[-1] is bad  # stopped at the first one
    lines = err.strip().splitlines()
    assert lines[0].startswith("shardlab train: note: --micro-batch 0 with pp=2")
    assert len(lines) == 2 and f"step {bad['step'] + 1} of 6: the " in lines[1], err
    assert "is not finite" in lines[1] and "--lr" in lines[1]
    steps = sorted(int(p.name.split("-")[1]) for p in ckpt.glob("step-*"))
    assert steps == list(range(1, bad["step"] + 1))[-3:]  # the diverged step: not saved
    assert not (ckpt / LOCK_NAME).exists()
