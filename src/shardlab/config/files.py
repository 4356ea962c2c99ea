"""Input files (a model's config.json, a ``--hardware-file``): checked before they are read.

Only a regular file of at most :data:`~shardlab.config.limits.MAX_FILE_BYTES` is read, so
a wrong path (``/dev/zero``, a FIFO, a checkpoint) is one SpecError line instead of a read
without end or a few GB in memory.
"""

from __future__ import annotations

import os
import stat
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
