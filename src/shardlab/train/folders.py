"""The folders a training run writes (``--log-dir``, ``--checkpoint-dir``): checked before
anything is made, then made and probed, each failure one SpecError naming the flag.

:func:`check_folder` writes nothing (the run may still be refused by a later check);
:func:`make_folder` creates the folder and writes and removes one probe file, the only
reliable test of a read-only mount or a permission that ``os.access`` gets wrong (root
passes every permission check, not a read-only file system). Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from shardlab.errors import SpecError


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def check_folder(field: str, path: str | None) -> None:
    """Refuse ``path`` for flag ``field`` when it is a file, lies under a file, or its
    nearest existing folder cannot be written (``os.access``); writes nothing."""
    if not path:
        return
    try:
        _check(field, path)
    except OSError as e:  # a name too long for the file system, a loop of links, ...
        raise SpecError(field, path, f"is not a usable path ({e.strerror or e})") from None


def _check(field: str, path: str) -> None:
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise SpecError(field, path, f"is a file; {_flag(field)} needs a folder (or a path "
                        "that does not exist yet)")
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise SpecError(field, path, f"cannot be made: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SpecError(field, path, f"cannot be written: {existing} is read-only or not "
                        "writable by this user")


def make_folder(field: str, path: str) -> None:
    """Create ``path`` (and its parents) and probe that a file can be written in it;
    SpecError naming the flag and the system's reason otherwise, with a folder this call
    created removed again."""
    p = Path(path)
    missing = [d for d in (p, *p.parents) if not d.exists()]  # leaf first
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".shardlab-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        for d in missing:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise SpecError(field, path, f"cannot be written ({e.strerror or e})") from None


def new_log_folder() -> str:
    """A fresh folder for a run's logs under the system's temporary folder; SpecError
    naming ``--log-dir`` when it cannot be made."""
    try:
        return tempfile.mkdtemp(prefix="shardlab-train-")
    except OSError as e:
        raise SpecError("log_dir", tempfile.gettempdir(), f"cannot hold a new log folder "
                        f"({e.strerror or e}); give --log-dir") from None
