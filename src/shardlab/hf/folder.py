"""The output folder of ``shardlab export`` and ``shardlab import``, written all at once.

The files go into a hidden temporary sibling (``.NAME.<random>.tmp`` beside ``NAME``),
which is renamed into place only once every file is written and synced; any failure
midway (a full disk, a read-only file system, Ctrl-C, a refused input) removes the
temporary, so ``NAME`` is never left half-written and a rerun is never refused as "not
empty". Only a SIGKILL or a power cut can leave the hidden temporary behind (never
``NAME``), and it can be deleted by hand.

Checked before any work: the target is a new or empty folder whose parent exists and
can be written (as ``shardlab report`` checks its output). An OSError while writing
becomes a SpecError naming the folder: one line, exit 2. Files get the mode the umask
gives (0644 under 022), as a plain ``open()`` would.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from pathlib import Path
from types import TracebackType

from shardlab.errors import SpecError


class OutputFolder:
    """A new or empty folder ``path`` to be written at once (see the module docstring).

    Construct it before the work (it checks the target and writes nothing); write the
    files inside ``with folder as tmp:`` into ``tmp``; a clean exit renames ``tmp`` to
    ``path``, an exception removes it. ``field`` names the folder in errors.
    """

    def __init__(self, path: str | os.PathLike[str], field: str = "out_dir") -> None:
        self.shown, self.field = str(path), field
        # The real path: a symlink to an empty folder is filled where it points, not
        # replaced by the rename.
        self.path = Path(os.path.realpath(Path(path).expanduser()))
        self.tmp: Path | None = None
        self._check()

    def _error(self, allowed: str) -> SpecError:
        return SpecError(self.field, self.shown, allowed)

    def _check(self) -> None:
        try:
            self._check_path(self.path)
        except OSError as e:  # a name too long for the file system, a loop of links, ...
            raise self._error(f"cannot be used: {e.strerror or e}") from e

    def _check_path(self, p: Path) -> None:
        if p.exists() and not p.is_dir():
            raise self._error("is a file; give a new or empty folder")
        try:
            if p.is_dir() and any(p.iterdir()):
                raise self._error("exists and is not empty (nothing is overwritten)")
        except OSError as e:
            raise self._error(f"cannot be read: {e.strerror or e}") from e
        if p.parent == p:
            raise self._error("is a file-system root; give a new or empty folder")
        if not p.parent.is_dir():
            raise self._error(f"its parent folder {p.parent} does not exist (create it "
                              "first)")
        if not os.access(p.parent, os.W_OK | os.X_OK):
            raise self._error(f"its parent folder {p.parent} cannot be written (read-only "
                              "file system or permission denied)")

    def __enter__(self) -> Path:
        while True:  # a random name; on the (unlikely) clash, another one
            # (the name cut so that the temporary's fits where the target's does)
            tmp = self.path.parent / f".{self.path.name[:200]}.{secrets.token_hex(4)}.tmp"
            try:
                # os.mkdir applies the umask: the folder gets the mode any new folder would.
                os.mkdir(tmp)
            except FileExistsError:
                continue
            except OSError as e:
                raise self._write_error(e) from e
            self.tmp = tmp
            return tmp

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self.tmp is not None, "OutputFolder used without `with`"
        try:
            if exc is None:
                self._commit(self.tmp)
        except OSError as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise self._write_error(e) from e
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        if exc is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            if isinstance(exc, OSError):
                raise self._write_error(exc) from exc

    def _write_error(self, e: OSError) -> SpecError:
        return self._error(f"could not be written: {e.strerror or e} (nothing was left "
                           "there)")

    def _commit(self, tmp: Path) -> None:
        """Give every file the umask's mode, sync it, rename ``tmp`` into place."""
        # The folder was made with 0777 minus the umask; a file gets 0666 minus the same.
        # (safetensors writes its file 0600, whatever the umask.)
        mode = stat.S_IMODE(tmp.stat().st_mode) & 0o666
        for f in tmp.iterdir():
            os.chmod(f, mode)
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)  # the data is on disk before the name says it is complete
            finally:
                os.close(fd)
        try:
            # rename(2) replaces an empty folder atomically, and fails on a non-empty one.
            os.rename(tmp, self.path)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise self._error("was created while this ran and is not empty (nothing "
                                  "is overwritten)") from e
            raise
        # The rename itself, best effort: the folder is complete and in place, so a file
        # system that cannot sync a folder (EINVAL) must not turn it into an error.
        with contextlib.suppress(OSError):
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
