"""Input files (a model's config.json, a ``--hardware-file``, a job file): checked before
they are read; output files (reports, pictures, job files, launch scripts): checked before
any work, written whole to a temporary name beside them and renamed into place.

Only a regular file of at most :data:`~shardlab.config.limits.MAX_FILE_BYTES` is read, so
a wrong path (``/dev/zero``, a FIFO, a checkpoint) is one SpecError line instead of a read
without end or a few GB in memory.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from shardlab.config.limits import MAX_FILE_BYTES
from shardlab.errors import SpecError


def check_input_file(field: str, path: str | Path, limit: int = MAX_FILE_BYTES) -> Path:
    """``path`` when it is a regular file of at most ``limit`` bytes, else SpecError naming
    ``field`` (missing, unreadable, a device or pipe or folder, or too large)."""
    p = Path(path)
    try:
        st = os.stat(p)  # follows a symlink: what matters is what would be read
    except OSError as e:
        raise SpecError(field, str(p), f"cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(field, str(p), "must be a regular file (not a folder, device or pipe)")
    if st.st_size > limit:
        raise SpecError(field, str(p), f"is {st.st_size:,} bytes; an input file must be at "
                        f"most {limit:,} bytes ({limit / 2**20:g} MiB)")
    return p


def read_input_text(field: str, path: str | Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of the input file ``path`` (:func:`check_input_file`); reads at most
    ``limit`` + 1 bytes, so a file that grows after the check is still refused."""
    p = check_input_file(field, path, limit)
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise SpecError(field, str(p), f"cannot be read: {e.strerror or e}") from None
    if len(data) > limit:
        raise SpecError(field, str(p), f"is over {limit:,} bytes; an input file must be at "
                        f"most {limit:,} bytes ({limit / 2**20:g} MiB)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecError(field, str(p), "is not UTF-8 text") from None


# -- output files ----------------------------------------------------------------------------


def check_output(path: str | Path, flag: str = "output") -> Path:
    """``path`` if a file can be written there (its folder exists and is writable, and it is
    not a folder); SpecError naming ``flag`` otherwise. Checked before any work is done.

    Writability is tried, not guessed from the mode bits: a temporary file is created in
    the folder and removed at once, so a read-only file system, or a place even root may
    not write (``/sys``), is refused here rather than after the work."""
    try:
        return _check_output(path, flag)
    except OSError as e:  # a name too long for the file system, a loop of links, ...
        raise SpecError(flag, str(path), f"is not a usable path ({e.strerror or e})") from None


def _check_output(path: str | Path, flag: str) -> Path:
    p = Path(path).expanduser()
    if not str(path).strip() or p.is_dir():
        raise SpecError(flag, str(path), "must be a file path, not a folder")
    parent = p.parent.resolve() if p.parent != Path("") else Path.cwd()
    if not parent.is_dir():
        raise SpecError(flag, str(path), f"its folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise SpecError(flag, str(path), "cannot be written (permission denied)")
    try_writing(flag, path, parent)
    return p


def try_writing(flag: str, path: str | Path, folder: Path) -> None:
    """Create and remove a temporary file in ``folder``: the only test a read-only file
    system, or a place even root may not write (``/sys``), cannot pass."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".shardlab-probe-", suffix=".tmp")
    except OSError as e:
        raise SpecError(flag, str(path), f"cannot be written ({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def umask_mode() -> int:
    """The mode a new file gets from ``open()`` under this process's umask (0o644 under
    the usual 022): what a written file should have, as any other tool's would."""
    # The umask can only be read by setting it; set it back at once (the CLI is one thread).
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place, with
    the mode the umask gives (:func:`umask_mode`; mkstemp makes its files 0o600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
