"""Run a function on N ranks through torch's elastic launcher, the machinery behind torchrun.

``launch("pkg.module:function", world_size, args)`` starts ``world_size`` worker
processes with :func:`torch.distributed.launcher.api.elastic_launch`: c10d
rendezvous on 127.0.0.1 and a free port (or a host you name), gloo on CPU and NCCL
when CUDA is present. Each worker initialises the default process group with a
collective timeout, calls ``function(ctx, *args)`` and returns its result; the
caller gets every rank's result, by rank.

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

from shardlab.errors import SpecError

SHUTDOWN_S = 5
"""Seconds the agent gives the ranks to exit after SIGTERM before it SIGKILLs them."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""The signals the elastic agent turns into a stop of every rank (its default set)."""


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
    launcher can name the rank that failed first rather than a peer that lost it.
    """
    torch.set_num_threads(threads)  # ranks share the machine's cores
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupt_once)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    else:
        device = "cpu"
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    if failures is not None:
        # One line in the rank's own log (our launcher redirects its stdout there; not under
        # torchrun, where stdout is the command's own): it got through torch's import and
        # the rendezvous. A stop signal from here on ends it without a traceback.
        print(f"rank {rank} of {world}: up ({backend})", flush=True)
    try:
        return _resolve(target)(RankContext(rank, world, local, device, backend, timeout_s),
                                *args)
    except BaseException as e:
        if failures is not None:
            note = {"time": time.time(), "error": f"{type(e).__name__}: {e}".splitlines()[0]}
            Path(failures, f"rank-{rank}.json").write_text(json.dumps(note))
        raise
    finally:
        if owns_group:
            dist.destroy_process_group()


def _interrupt_once(signum: int, frame: Any) -> None:
    """A rank's SIGINT handler: KeyboardInterrupt the first time, nothing after. Ctrl-C
    reaches a rank twice, from the terminal and from the agent stopping it, and a second
    KeyboardInterrupt inside the interpreter's exit prints "Exception ignored in atexit
    callback" tracebacks on the terminal (the rank's log redirect is undone by then)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _elastic_entry(target: str, args: tuple, backend: str, timeout_s: float,
                   threads: int, failures: str) -> Any:
    """Spawned worker: record any exception for the agent, then run the rank."""
    return record(_run_rank)(target, args, backend, timeout_s, threads, failures)


def under_torchrun() -> bool:
    """Whether this process is a worker that torchrun (or any elastic agent) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _rank_log_tail(root: Path, run_id: str, rank: int) -> str:
    """The last lines a rank printed and, when it raised, its traceback (the agent keeps
    that in error.json)."""
    parts = []
    for folder in sorted(root.glob(f"{run_id}*/attempt_0/{rank}")):
        for name in ("stdout.log", "stderr.log"):
            text = _tail(folder / name, 10)
            if text.strip():
                parts.append(text)
        try:
            info = json.loads((folder / "error.json").read_text())["message"]
            stack = info.get("extraInfo", {}).get("py_callstack", "")
            parts.append("\n".join(stack.strip().splitlines()[-12:]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    return "\n".join(parts)


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
        monitor_interval=0.1, start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(root), redirects=Std.ALL, tee=Std.NONE),
        shutdown_timeout=SHUTDOWN_S)
    # The agent sets its own handlers for STOP_SIGNALS (main thread only) and leaves them.
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS} if main else {}
    try:
        with _QuietElastic():
            results = elastic_launch(config, _elastic_entry)(target, args, backend, timeout_s,
                                                             threads, str(failures))
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
    return [results[r] for r in sorted(results)]


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
    return LaunchError(rank, error, _rank_log_tail(root, run_id, rank), str(root))


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
