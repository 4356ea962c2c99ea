"""Storing a measurement: the JSON document written whole, atomically, where
:func:`shardlab.config.measured.load_measurement` reads it."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from shardlab.config.measured import measurement_path
from shardlab.errors import SpecError


def save_measurement(doc: dict[str, Any], path: str | Path | None = None) -> Path:
    """Write ``doc`` as JSON to ``path`` (default :func:`measurement_path`) atomically.

    The text goes to a temporary file in the same folder, which then replaces the
    target (``os.replace``), so a reader never sees half a file. Returns the path.
    A folder that cannot be written is a SpecError naming it.
    """
    target = Path(path) if path is not None else measurement_path()
    text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp = None
    except OSError as e:
        raise SpecError("measurement_file", str(target),
                        f"cannot be written ({e.strerror}); set SHARDLAB_HOME to a writable "
                        "folder") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return target
