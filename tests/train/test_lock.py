"""The checkpoint folder's run lock: a second holder refused with the first one's pid, a
stale lock (its process gone) taken over, a live one from a record alone respected, and
the lock released however the run ends."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shardlab.errors import SpecError
from shardlab.train.lock import LOCK_NAME, alive, checkpoint_lock, process_start


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    with checkpoint_lock(tmp_path) as path:
        record = json.loads(path.read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(SpecError) as info, checkpoint_lock(tmp_path):
            pass
        text = str(info.value)
        assert f"pid {os.getpid()}" in text and str(tmp_path) in text and "\n" not in text
        assert info.value.field == "checkpoint_dir"
        assert path.exists()  # the refused one removed nothing
    assert not (tmp_path / LOCK_NAME).exists()  # released at the end of the block


def test_released_when_the_run_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), checkpoint_lock(tmp_path):
        raise RuntimeError("a rank failed")
    assert not (tmp_path / LOCK_NAME).exists()
    with checkpoint_lock(tmp_path):  # and can be taken again
        pass


def test_a_stale_lock_is_taken_over(tmp_path: Path) -> None:
    gone = dead_pid()
    assert not alive(gone)
    (tmp_path / LOCK_NAME).write_text(json.dumps(
        {"pid": gone, "host": socket.gethostname(), "since": 0}))
    with checkpoint_lock(tmp_path) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_reused_pid_is_not_the_holder(tmp_path: Path) -> None:
    # This process's pid with another start time: the holder was an earlier process.
    assert process_start(os.getpid()) is not None
    (tmp_path / LOCK_NAME).write_text(json.dumps(
        {"pid": os.getpid(), "host": socket.gethostname(), "start": "1", "since": 0}))
    with checkpoint_lock(tmp_path) as path:
        assert json.loads(path.read_text())["start"] == process_start(os.getpid())


@pytest.mark.parametrize("host", ["this", "other"])
def test_a_live_or_unverifiable_holder_is_respected(tmp_path: Path, host: str) -> None:
    # A record without the flock: a live process on this host (pid 1 always is), or any
    # process on another host, which cannot be checked from here.
    name = socket.gethostname() if host == "this" else "elsewhere.invalid"
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": name, "since": 0}))
    with pytest.raises(SpecError, match=f"pid 1 on {name}"), checkpoint_lock(tmp_path):
        pass
    assert (tmp_path / LOCK_NAME).exists()


def test_a_holder_in_another_process_is_refused(tmp_path: Path) -> None:
    code = ("import sys, time; from shardlab.train.lock import checkpoint_lock\n"
            f"with checkpoint_lock({str(tmp_path)!r}):\n"
            "    print('held', flush=True); sys.stdin.readline()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(SpecError, match=f"pid {holder.pid} "), checkpoint_lock(tmp_path):
            pass
    finally:
        holder.communicate("\n", timeout=30)
    assert holder.returncode == 0 and not (tmp_path / LOCK_NAME).exists()
