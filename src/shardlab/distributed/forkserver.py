"""The warm process every rank of :func:`shardlab.distributed.launch.launch` is forked from.

The launcher starts ranks with torch's ``forkserver`` start method: the first launch of a
process starts multiprocessing's fork server, which imports torch, torch.distributed and
shardlab's rank modules (:data:`PRELOAD`) once; each rank after that is a ``fork`` of that
single-threaded, already-warm process, not a fresh interpreter importing torch (about 2 s
of CPU per rank on the 2-core build machine, 3-6 s under load). The server is
multiprocessing's own, one per process: every later launch of the same process (a
restart, the test suite's dozens) forks from it, and it ends when the process does.

This module imports no torch, so a command can call :func:`start` before it imports torch
itself: ``shardlab train`` does, right after its checks, and the server's imports then run
beside the command's own on a second core instead of after them.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import signal
import tempfile
import threading
from multiprocessing import forkserver

START_METHOD = "forkserver"
"""The start method the launcher hands torch's elastic agent."""

PRELOAD = (
    "shardlab.distributed.launch",  # torch, torch.distributed, the elastic agent's modules
    "shardlab.distributed.parallelize",  # DTensor, tensor parallel, FSDP2, DDP, AC
    "shardlab.distributed.pipeline",  # torch.distributed.pipelining
    "shardlab.distributed.checkpoint",  # torch.distributed.checkpoint
    "shardlab.distributed.measure",  # FlopCounterMode, the comm meters
)
"""What the fork server imports before it forks any rank: the heavy part of every rank's
imports (a rank then imports its own target's module, train's loop or verify's
experiments, in about 0.1 s). torch modules only through shardlab's, so the list follows
what shardlab's ranks actually load."""


AF_UNIX_PATH_MAX = 107
"""Bytes an AF_UNIX socket path may hold on Linux (``sun_path``'s 108, less its NUL)."""
_LISTENER_TAIL = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
"""What multiprocessing appends to the temporary folder for the server's socket
(``util.get_temp_dir``'s ``pymp-`` folder, ``connection.arbitrary_address``'s name)."""


def _short_socket_dir() -> None:
    """multiprocessing puts the fork server's socket in a folder of its own under TMPDIR; a
    TMPDIR deeper than an AF_UNIX path allows (pytest's ``tmp_path``, a scheduler's per-job
    folder) fails that bind with "AF_UNIX path too long". Then this process's multiprocessing
    folder goes under /tmp instead (cached by multiprocessing for the process, removed at
    its exit); TMPDIR itself stays what the caller set for everything else."""
    if len(os.fsencode(tempfile.gettempdir())) + _LISTENER_TAIL <= AF_UNIX_PATH_MAX:
        return
    if not os.access("/tmp", os.W_OK):
        return  # nowhere shorter to go: the bind names the cause itself
    saved = tempfile.tempdir
    tempfile.tempdir = "/tmp"
    try:
        multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = saved


def start() -> None:
    """Start this process's fork server, preloading :data:`PRELOAD`; nothing when it runs
    already (and a new one when it died). Returns at once: the server imports in the
    background, and the first fork waits for it.

    The server is started with SIGINT ignored (a disposition that survives ``exec``; the
    parent's own handler is put back at once), so a Ctrl-C while it imports torch prints
    no traceback from it; its ranks inherit that, until the launcher's rank body sets its
    own handler."""
    multiprocessing.get_context(START_METHOD).set_forkserver_preload(list(PRELOAD))
    _short_socket_dir()
    previous = signal.getsignal(signal.SIGINT)
    quiet = threading.current_thread() is threading.main_thread() and previous is not None
    if quiet:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        if quiet:
            signal.signal(signal.SIGINT, previous)
