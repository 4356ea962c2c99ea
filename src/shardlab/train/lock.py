"""One training run per checkpoint folder: a lock file in it, held for the whole run.

Two runs writing ``step-N.tmp`` in the same folder race (one removes what the other is
writing), so ``shardlab train --checkpoint-dir D`` takes ``D/`` :data:`LOCK_NAME` before
any rank starts and removes it when the run ends, however it ends (a Python exception, a
signal the command turns into one). The file names its holder as JSON: pid, host, the
process's start time (``/proc/PID/stat``, so a reused pid is not mistaken for the holder)
and when it was taken.

A lock is taken over when it is stale: its holder ran on this host and that process is
gone (SIGKILLed, the machine's OOM killer), the file left behind. A lock from another
host is never taken over: its process cannot be checked from here.

Mutual exclusion on this host does not rest on reading pids: the file is also held with
``flock`` while it is inspected and written, and for the run's whole life, so two runs
starting at the same moment cannot both take over the same stale lock, and a run killed
without cleanup frees the ``flock`` with its death. Torch-free (the command line takes the
lock before it imports torch).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardlab.errors import SpecError

LOCK_NAME = ".shardlab-train.lock"
_READ_TRIES = 20  # x 0.05 s: a holder that has just taken the flock writes its pid next


def process_start(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (the start time in clock ticks after boot), which
    with the pid names a process uniquely; None when the process does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return text.rsplit(")", 1)[1].split()[19]


def alive(pid: int, start: str | None = None) -> bool:
    """Whether process ``pid`` runs on this host (and, given ``start``, is the process that
    started then, not a later one that reuses the pid)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    return start is None or process_start(pid) in (None, start)


def _holder(fd: int) -> dict[str, Any] | None:
    """The lock file's record, or None when it is empty or not a record (being written)."""
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        doc = json.loads(os.read(fd, 4096).decode("utf-8", "replace") or "null")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("pid"), int) else None


def _in_use(folder: Path, holder: dict[str, Any] | None) -> SpecError:
    who = (f"pid {holder['pid']} on {holder.get('host', '?')}, since "
           f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder.get('since', 0)))}"
           if holder else "pid unknown")
    return SpecError("checkpoint_dir", str(folder), f"is in use by another shardlab train "
                     f"({who}; lock {folder / LOCK_NAME}); wait for it to end or use another "
                     "folder")


def _stale(holder: dict[str, Any] | None, host: str) -> bool:
    """Whether a lock whose flock is free may be taken over: no record (a holder that died
    before writing it), or a holder on this host that is gone."""
    if holder is None:
        return True
    return holder.get("host") == host and not alive(holder["pid"], holder.get("start"))


def _open_locked(path: Path, folder: Path) -> int:
    """A descriptor of ``path`` (created if missing) with the flock held; SpecError when a
    live run holds it. Retries when the file was removed between open and flock (its
    holder released it): the flock must be on the file the path names."""
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = None
            for _ in range(_READ_TRIES):
                holder = _holder(fd)
                if holder is not None:
                    break
                time.sleep(0.05)
            os.close(fd)
            raise _in_use(folder, holder) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise _in_use(folder, None)


@contextlib.contextmanager
def checkpoint_lock(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``folder``'s run lock (the folder must exist) for the ``with`` block; yields
    the lock file's path. SpecError (exit 2, one line naming the folder and the holder's
    pid) when another live run holds it; a stale lock is taken over (module docstring)."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    host = socket.gethostname()
    try:
        fd = _open_locked(path, folder)
    except OSError as e:
        raise SpecError("checkpoint_dir", str(folder), f"cannot hold a lock file there "
                        f"({e.strerror})") from e
    try:
        if not _stale(_holder(fd), host):  # a live holder without flock (another host)
            raise _in_use(folder, _holder(fd))
        record = {"pid": os.getpid(), "host": host, "start": process_start(os.getpid()),
                  "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        try:
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # while the flock is held: no one else can be inside
    finally:
        os.close(fd)
