"""What the launcher learns about a rank that failed: whether a peer died silently (and
how long to wait so the agent reports that death first), the last lines a rank printed,
and how a rank that raised nothing died (:func:`death_note`)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

SHUTDOWN_S = 5
"""Seconds the agent gives the ranks to exit after SIGTERM before it SIGKILLs them."""


def wait_for_a_silent_death(failures: Path, rank: int, world: int) -> None:
    """A failing rank that finds a peer already dead with neither a note nor a mark that
    its function returned (it exited or was killed: the likely cause of this rank's own
    error, a collective whose peer vanished) waits for the agent to stop it,
    :data:`SHUTDOWN_S` at most, so that the agent reports the dead peer, with its exit
    code, as the job's failure. A forked rank leaves at once (``os._exit``, no interpreter
    teardown), and without the wait the agent, polling every 0.1 s, could see this rank's
    exit first and lose the dead peer's exit code; a spawned rank's 1-2 s of teardown used
    to give that order by chance. A peer is looked at a few times over 0.1 s, as one whose
    sockets just closed may still be on its way out."""
    for _ in range(5):
        for peer in range(world):
            if peer == rank or any(Path(failures, name).exists()
                                   for name in (f"rank-{peer}.json", f"done-{peer}")):
                continue
            try:
                pid = int(Path(failures, f"pid-{peer}").read_text())
            except (OSError, ValueError):
                continue
            if not alive(pid):
                time.sleep(SHUTDOWN_S)
                return
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not; without
    /proc, a process that exists runs)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def rank_log_tail(root: Path, run_id: str, rank: int) -> str:
    """The last lines a rank printed and, when it raised, its traceback (the agent keeps
    that in error.json)."""
    parts = []
    for folder in sorted(root.glob(f"{run_id}*/attempt_0/{rank}")):
        for name in ("stdout.log", "stderr.log"):
            text = tail(folder / name, 10)
            if text.strip():
                parts.append(text)
        try:
            info = json.loads((folder / "error.json").read_text())["message"]
            stack = info.get("extraInfo", {}).get("py_callstack", "")
            parts.append("\n".join(stack.strip().splitlines()[-12:]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    return "\n".join(parts)


def death_note(exitcode: int) -> str:
    """How a rank that left no exception died: its exit code, the signal, and for SIGKILL
    the usual sender, the kernel's out-of-memory killer."""
    if exitcode >= 0:
        return f"died with exit code {exitcode}"
    sig = -exitcode
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    if sig == signal.SIGKILL:
        return (f"out of memory? (killed by signal {sig}, {name}, as the kernel's OOM killer "
                "does; `dmesg` tells)")
    return f"died with exit code {exitcode} (signal {sig}, {name})"
