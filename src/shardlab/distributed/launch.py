"""Run a function on N ranks through torch's elastic launcher, the machinery behind torchrun.

``launch("pkg.module:function", world_size, args)`` starts ``world_size`` worker
processes with :func:`torch.distributed.launcher.api.elastic_launch`: c10d
rendezvous on 127.0.0.1 and a free port (or a host you name), gloo on CPU and NCCL
when CUDA is present. Each worker initialises the default process group with a
collective timeout, calls ``function(ctx, *args)`` and returns its result; the
caller gets every rank's result, by rank.

Ranks are forked from a warm fork server (torch's ``forkserver`` start method, its
server preloaded with torch and shardlab's rank modules: :mod:`shardlab.distributed.forkserver`),
one per launching process and kept for every later launch. A forked rank starts in the
server's environment, so it takes the launcher's environment of the moment of the launch
(``os.environ``) before anything else, beside the variables the agent set for it.

Each rank's stdout and stderr go to its own log file, redirected at the file
descriptor (``Std.ALL``), so the C++ chatter of gloo and NCCL, which writes to fd 1
and 2 directly and which Python's ``redirect_stdout`` cannot catch, never reaches
shardlab's stdout. When a rank raises or dies, the elastic agent stops the others;
:class:`LaunchError` names the rank, its exception and the tail of its log, and no
worker is left running. A rank SIGKILLed (exit -9) is said to be out of memory, as the
kernel's OOM killer is what usually sends that signal.

The agent runs in the calling thread, which must be the main thread for it to catch
SIGINT, SIGTERM, SIGHUP and SIGQUIT: on any of them it stops every rank (SIGKILL after
:data:`SHUTDOWN_S`), and the call raises ``KeyboardInterrupt`` (SIGINT) or
:class:`Terminated` (the others); the caller's own handlers are put back either way.

Under ``torchrun`` (the environment has ``RANK`` and ``WORLD_SIZE``) the same call
runs the function in this process, as one rank of the job torchrun started, on as
many nodes as it spans; results are gathered to rank 0 (the others get ``None``).
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from shardlab.distributed import forkserver
from shardlab.distributed.rank_failures import (
    SHUTDOWN_S,
    death_note,
    rank_log_tail,
    wait_for_a_silent_death,
)
from shardlab.errors import SpecError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""The signals the elastic agent turns into a stop of every rank (its default set)."""


_ENVIRON_AT_IMPORT = dict(os.environ)
"""This process's environment when this module was imported: in a rank, the fork server's
(it preloads this module), from before the agent's variables (RANK, MASTER_PORT, ...)."""


class Terminated(Exception):
    """The job was stopped by a signal other than SIGINT (SIGTERM, SIGHUP, SIGQUIT); the
    ranks are gone. ``signum`` is the signal; the shell's exit code is 128 + signum."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"terminated by {signal.Signals(self.signum).name}")


@contextmanager
def signals_stop() -> Iterator[None]:
    """Around a command that starts ranks: SIGTERM, SIGHUP and SIGQUIT raise
    :class:`Terminated` in the main thread (SIGINT already raises KeyboardInterrupt), so
    the command's ``finally`` blocks run (a lock released, nothing left half-made) where
    the default action would end the process on the spot. Outside the main thread, where
    Python cannot set handlers, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS if s != signal.SIGINT}
    for s in previous:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class LaunchError(RuntimeError):
    """A rank failed: which one, its error, and the tail of its log."""

    def __init__(self, rank: int, error: str, log_tail: str, log_dir: str) -> None:
        self.rank, self.error, self.log_tail, self.log_dir = rank, error, log_tail, log_dir
        tail = f"\n--- tail of rank {rank}'s log ---\n{log_tail}" if log_tail else ""
        super().__init__(f"rank {rank} failed: {error} (logs in {log_dir}){tail}")


@dataclass(frozen=True)
class RankContext:
    """What a rank's function gets: its rank, the world size, its device, its backend."""

    rank: int
    world_size: int
    local_rank: int
    device: str
    backend: str
    timeout_s: float


def backend_for_this_machine() -> str:
    """NCCL when CUDA is present, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _resolve(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _run_rank(target: str, args: tuple, backend: str, timeout_s: float,
              threads: int, failures: str | None = None) -> Any:
    """The body of one rank: process group up, the function, process group down.

    A failing rank writes when and how it failed into ``failures`` (a folder), so the
    launcher can name the rank that failed first rather than a peer that lost it; each
    rank also writes its pid there, and a mark when its function returned, so a failing
    rank can tell a peer that died without a word (:func:`_wait_for_a_silent_death`).
    """
    torch.set_num_threads(threads)  # ranks share the machine's cores
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupt_once)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if failures is not None:
        Path(failures, f"pid-{rank}").write_text(str(os.getpid()))
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = f"cuda:{local}" if backend == "nccl" else "cpu"
    owns_group = not dist.is_initialized()
    try:
        if backend == "nccl":
            torch.cuda.set_device(local)
        # Inside the try: a peer that dies right after the rendezvous breaks this rank's
        # connection set-up, and this rank must then leave a note and wait for the agent to
        # see the dead peer, not be taken for the cause.
        if owns_group:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        if failures is not None:
            # One line in the rank's own log (our launcher redirects its stdout there; not
            # under torchrun, where stdout is the command's own): it got through torch's
            # import and the rendezvous. A stop signal from here on ends it quietly.
            print(f"rank {rank} of {world}: up ({backend})", flush=True)
        result = _resolve(target)(RankContext(rank, world, local, device, backend, timeout_s),
                                  *args)
    except BaseException as e:
        if failures is not None:
            note = {"time": time.time(), "error": f"{type(e).__name__}: {e}".splitlines()[0]}
            # Written whole, then renamed: the agent may kill this rank mid-write.
            Path(failures, f".rank-{rank}.tmp").write_text(json.dumps(note))
            Path(failures, f".rank-{rank}.tmp").replace(Path(failures, f"rank-{rank}.json"))
            wait_for_a_silent_death(Path(failures), rank, world)
        raise
    else:
        if failures is not None:  # a peer that fails later finds this rank gone, not dead
            Path(failures, f"done-{rank}").touch()
        return result
    finally:
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()


def _interrupt_once(signum: int, frame: Any) -> None:
    """A rank's SIGINT handler: KeyboardInterrupt the first time, nothing after. Ctrl-C
    reaches a rank twice, from the terminal and from the agent stopping it, and a second
    KeyboardInterrupt inside the interpreter's exit prints "Exception ignored in atexit
    callback" tracebacks on the terminal (the rank's log redirect is undone by then)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _elastic_entry(target: str, args: tuple, backend: str, timeout_s: float,
                   threads: int, failures: str, environ: dict[str, str]) -> Any:
    """A forked worker: the launcher's environment, then record any exception for the
    agent and run the rank."""
    _take_environment(environ)
    return record(_run_rank)(target, args, backend, timeout_s, threads, failures)


def _take_environment(environ: dict[str, str]) -> None:
    """``os.environ`` made the launcher's ``environ`` plus what the agent set for this
    worker: the variables whose value differs from the fork server's environment. A spawned
    rank got the launcher's environment of the moment it started; a forked one starts with
    the server's, taken when the server started (earlier, in a process that launches many
    jobs). Variables read when torch loads (``OMP_NUM_THREADS``, ``TORCH_*`` at import)
    are the server's: they were read there, once. The temporary folder, which the server's
    imports looked up and ``tempfile`` keeps, is looked up again from ``TMPDIR``."""
    agent = {k: v for k, v in os.environ.items() if _ENVIRON_AT_IMPORT.get(k) != v}
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(agent)
    tempfile.tempdir = None


def under_torchrun() -> bool:
    """Whether this process is a worker that torchrun (or any elastic agent) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


class _QuietElastic:
    """Keep the elastic agent's own log lines (worker tracebacks, restarts) off the
    caller's stderr: shardlab reports the failure itself, and the logs keep the rest."""

    NAMES = ("torch.distributed.elastic", "torch.distributed.launcher")

    def __enter__(self) -> None:
        # torch gives some of its elastic modules' loggers a level of their own, which a
        # parent's level does not override: quiet each one that exists.
        names = [n for n in logging.root.manager.loggerDict
                 if n.startswith(self.NAMES)] + list(self.NAMES)
        self.levels = {n: logging.getLogger(n).level for n in names}
        for n in names:
            logging.getLogger(n).setLevel(logging.CRITICAL)

    def __exit__(self, *exc: object) -> None:
        for n, level in self.levels.items():
            logging.getLogger(n).setLevel(level)


def launch(target: str, world_size: int, args: tuple = (), *, timeout_s: float = 30.0,
           host: str = "127.0.0.1", port: int | None = None, log_dir: str | None = None,
           backend: str | None = None, threads: int | None = None) -> list[Any]:
    """Run ``target`` ("module:function") on ``world_size`` ranks; return results by rank.

    ``timeout_s`` bounds every collective (and so how long a job survives a dead peer);
    ``host`` is where the rendezvous listens (loopback unless you name one).
    """
    if world_size < 1:
        raise SpecError("world_size", world_size, "must be >= 1")
    backend = backend or backend_for_this_machine()
    # Ranks share this machine's cores unless told otherwise.
    threads = threads or max(1, (os.cpu_count() or 1) // world_size)
    if under_torchrun():
        result = _run_rank_gathered(target, args, backend, timeout_s, threads)
        return result if result is not None else []
    root = Path(log_dir or tempfile.mkdtemp(prefix="shardlab-logs-"))
    root.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    failures = root / f"failures-{run_id}"
    failures.mkdir()
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=world_size, run_id=run_id,
        rdzv_backend="c10d", rdzv_endpoint=f"{host}:{port or free_port(host)}",
        rdzv_configs={"timeout": int(max(timeout_s, 10))}, max_restarts=0,
        monitor_interval=0.1, start_method=forkserver.START_METHOD,
        logs_specs=DefaultLogsSpecs(log_dir=str(root), redirects=Std.ALL, tee=Std.NONE),
        shutdown_timeout=SHUTDOWN_S)
    # The agent sets its own handlers for STOP_SIGNALS (main thread only) and leaves them.
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS} if main else {}
    forkserver.start()  # the first launch of this process starts it, the others reuse it
    before = set(multiprocessing.active_children())
    try:
        with _QuietElastic():
            results = elastic_launch(config, _elastic_entry)(target, args, backend, timeout_s,
                                                             threads, str(failures),
                                                             dict(os.environ))
    except SignalException as e:
        # The agent turns the signal into its own exception after stopping the ranks; to
        # the caller it is the interrupt or termination it would have been without ranks.
        if e.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise Terminated(e.sigval) from None
    except ChildFailedError as e:
        raise _failure(e, failures, root, run_id) from None
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        _stop_leftovers(before)
    return [results[r] for r in sorted(results)]


def _stop_leftovers(before: set[multiprocessing.process.BaseProcess]) -> None:
    """Stop the workers of this launch still running when it ends: none, unless a signal
    reached the agent while it was starting them (torch's agent then raises before it holds
    them, and stops none; a forked rank ignores SIGINT until its body runs, so the
    terminal's Ctrl-C does not end it either). Each gets SIGTERM, SIGKILL after
    :data:`SHUTDOWN_S`; left alone, they would hold the interpreter's exit, which joins
    multiprocessing's children, until their rendezvous timed out (minutes)."""
    left = [p for p in multiprocessing.active_children() if p not in before]
    for p in left:
        p.terminate()
    deadline = time.monotonic() + SHUTDOWN_S
    for p in left:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _failure(e: ChildFailedError, failures: Path, root: Path,
             run_id: str) -> BaseException:
    """What a failed job raises: the first rank to fail is the cause (the others fail after
    it, their peers vanished mid-collective); ranks that all raised KeyboardInterrupt were
    Ctrl-C'd with the terminal's process group before the agent saw the signal."""
    notes = {int(p.stem.split("-")[1]): json.loads(p.read_text())
             for p in failures.glob("rank-*.json")}
    silent = sorted(r for r in e.failures if r not in notes)
    if notes and not silent:
        if all(n["error"].startswith("KeyboardInterrupt") for n in notes.values()):
            return KeyboardInterrupt()
        rank = min(notes, key=lambda r: (notes[r]["time"], r))
        error = notes[rank]["error"]
    else:  # a rank that died without raising left no note: it is the cause
        rank = silent[0] if silent else min(e.failures)
        error = death_note(e.failures[rank].exitcode)
    return LaunchError(rank, error, rank_log_tail(root, run_id, rank), str(root))


def _run_rank_gathered(target: str, args: tuple, backend: str, timeout_s: float,
                       threads: int) -> list[Any] | None:
    """Under torchrun: run this rank, gather every rank's result to rank 0."""
    def body(ctx: RankContext, *a: Any) -> list[Any] | None:
        mine = _resolve(target)(ctx, *a)
        every: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(every, mine)
        return every if ctx.rank == 0 else None

    global _TORCHRUN_BODY
    _TORCHRUN_BODY = body
    return _run_rank(f"{__name__}:_torchrun_body", args, backend, timeout_s, threads)


_TORCHRUN_BODY: Callable[..., Any] | None = None


def _torchrun_body(ctx: RankContext, *args: Any) -> Any:
    assert _TORCHRUN_BODY is not None
    return _TORCHRUN_BODY(ctx, *args)
