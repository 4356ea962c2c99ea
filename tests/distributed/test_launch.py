"""The launcher: ranks forked from the warm fork server, results by rank, per-rank logs,
and a failing rank that ends the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from shardlab.distributed import forkserver
from shardlab.distributed.launch import LaunchError, launch

pytestmark = pytest.mark.multiprocess

RANKS = textwrap.dedent('''
    import os, sys, tempfile, time
    import torch
    import torch.distributed as dist

    def total(ctx, base):
        t = torch.tensor([float(base + ctx.rank)])
        dist.all_reduce(t)
        os.write(1, b"C++-style chatter straight to fd 1\\n")
        print("python print on rank", ctx.rank)
        return {"rank": ctx.rank, "world": ctx.world_size, "sum": float(t),
                "backend": ctx.backend, "marker": os.environ.get("SHARDLAB_TEST_MARKER"),
                "late": os.environ.get("SHARDLAB_TEST_LATE"), "parent": os.getppid(),
                "tmp": tempfile.gettempdir()}

    def fail(ctx, bad, how):
        if ctx.rank == bad:
            if how == "raise":
                raise ValueError(f"injected on rank {ctx.rank}")
            if how == "kill":  # what the kernel's OOM killer does
                os.kill(os.getpid(), 9)
            os._exit(7)
        t = torch.ones(1)
        dist.all_reduce(t)  # the healthy ranks wait here for the dead one
        time.sleep(60)
        return "unreachable"
''')


@pytest.fixture
def ranks_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"ranks_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(RANKS)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers get the parent's sys.path
    marker = uuid.uuid4().hex
    monkeypatch.setenv("SHARDLAB_TEST_MARKER", marker)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path),
                                                     os.environ.get("PYTHONPATH", "")]))
    return name


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    """``pid``'s children that are still running (not zombies)."""
    alive = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                stat = Path(f"/proc/{child}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(int(child))
    return alive


def _fork_servers() -> list[int]:
    """This process's fork servers (multiprocessing's; the launcher's ranks fork from it)."""
    return [c for c in _children(os.getpid()) if "multiprocessing.forkserver" in _cmdline(c)]


def _processes_with(marker: str) -> list[int]:
    """Ranks left running: the fork servers' children, and any process whose environment
    holds ``marker`` (multiprocessing's fork server and resource tracker aside: they live as
    long as this process, and hold the marker when a launch of this test started them)."""
    servers = _fork_servers()
    found = [c for s in servers for c in _children(s)]
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in [os.getpid(), *servers, *found]:
            continue
        if "multiprocessing.resource_tracker" in _cmdline(int(pid)):
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in env:
            found.append(int(pid))
    return found


def test_results_come_back_by_rank(ranks_module: str, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    forkserver.start()  # (a no-op when an earlier launch of this process started it)
    late = uuid.uuid4().hex  # set after the server started: the ranks still see it
    monkeypatch.setenv("SHARDLAB_TEST_LATE", late)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # and use this temporary folder
    out = launch(f"{ranks_module}:total", 2, (10,), timeout_s=30, log_dir=str(tmp_path / "l"))
    assert [r["rank"] for r in out] == [0, 1]
    assert all(r["sum"] == 21.0 and r["world"] == 2 and r["backend"] == "gloo" for r in out)
    # forked from this process's warm fork server, not spawned by this process
    assert [r["parent"] for r in out] == _fork_servers() * 2
    assert all(r["marker"] == os.environ["SHARDLAB_TEST_MARKER"] and r["late"] == late
               and r["tmp"] == str(tmp_path) for r in out)
    logs = sorted((tmp_path / "l").rglob("stdout.log"))
    assert len(logs) == 2 and "chatter" in logs[0].read_text()  # the fd-level print is here
    assert all("up (gloo)" in p.read_text() for p in logs)  # each rank got past its start


@pytest.mark.parametrize("how", ["raise", "exit", "kill"])
def test_a_failing_rank_ends_the_job_and_is_named(ranks_module: str, how: str) -> None:
    marker = os.environ["SHARDLAB_TEST_MARKER"]
    start = time.monotonic()
    with pytest.raises(LaunchError) as e:
        launch(f"{ranks_module}:fail", 2, (1, how), timeout_s=20)
    assert time.monotonic() - start < 30
    assert e.value.rank == 1
    if how == "raise":
        assert "ValueError: injected on rank 1" in e.value.error
        assert "injected on rank 1" in e.value.log_tail
    elif how == "exit":
        assert "exit code 7" in e.value.error
    else:
        assert e.value.error.startswith("out of memory? (killed by signal 9, SIGKILL")
        assert str(e.value).startswith("rank 1 failed: out of memory?")
    time.sleep(0.5)
    assert _processes_with(marker) == []  # nothing left running


def test_gloo_chatter_never_reaches_stdout(ranks_module: str, tmp_path: Path) -> None:
    code = (f"import json, sys; sys.path.insert(0, {str(tmp_path)!r}); "
            "from shardlab.distributed.launch import launch; "
            f"print(json.dumps(launch('{ranks_module}:total', 2, (0,), timeout_s=30)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert [x["sum"] for x in json.loads(r.stdout)] == [1.0, 1.0]  # stdout is only the JSON
    assert "chatter" not in r.stdout + r.stderr


def test_a_rank_that_fails_to_set_up_its_group_is_named() -> None:
    # The process group's set-up runs inside the rank's guard: its error is the job's, named
    # with its rank, not an unexplained exit code.
    start = time.monotonic()
    with pytest.raises(LaunchError) as e:
        launch("builtins:repr", 2, timeout_s=20, backend="bogus")
    assert time.monotonic() - start < 30
    # Both ranks fail alike; the first note written names the job's failure.
    assert e.value.rank in (0, 1) and "Unknown backend type bogus" in e.value.error


def test_the_fork_server_starts_under_a_tmpdir_too_deep_for_its_socket(tmp_path: Path) -> None:
    # pytest's own tmp_path grows past what an AF_UNIX socket path holds once its counter
    # has three digits: multiprocessing's bind then failed with "AF_UNIX path too long".
    deep = tmp_path / ("d" * 60) / "tmp"
    deep.mkdir(parents=True)
    assert len(str(deep)) + len("/pymp-XXXXXXXX/listener-XXXXXXXX") > 107
    code = ("from shardlab.distributed import forkserver\n"
            "import multiprocessing.util as u, tempfile\n"
            "forkserver.start()\n"
            "print(u.get_temp_dir().startswith('/tmp/pymp-'), tempfile.gettempdir())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TMPDIR": str(deep)}, timeout=120)
    assert out.returncode == 0, out.stderr
    # The socket's folder moved to /tmp; TMPDIR stays the caller's for everything else.
    assert out.stdout.split() == ["True", str(deep)]
