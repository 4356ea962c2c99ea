"""``shardlab launch``: the sbatch script and the per-node torchrun commands of a job file,
the counts that do not give the layout's world refused, and the emitted torchrun commands,
run as 2 "nodes" x 2 processes on loopback, training bitwise the losses of ``shardlab train
--nproc 4`` (the one expensive test here; the Slurm run is test_launch_slurm.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shardlab.cli import main

JOB = ('[model]\nlayers = 2\n[layout]\ndp = 2\ntp = 2\n[run]\nsteps = 3\n'
       '[checkpoint]\nmax_restarts = 2\n')


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(JOB)
    return path


def launch(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["launch", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def commands(text: str) -> list[str]:
    """The command lines of an emitted file (not its comments)."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_sbatch_script(capsys: pytest.CaptureFixture[str], job: Path,
                           tmp_path: Path) -> None:
    code, out, _ = launch(capsys, str(job), "--nodes", "2", "--gpus-per-node", "2", "--emit",
                          "slurm", "--port", "29411", "--time", "01:00:00")
    assert code == 0
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive",
                 "#SBATCH --gpus-per-node=2", "#SBATCH --time=01:00:00",
                 "#SBATCH --job-name=shardlab-job", "set -euo pipefail",
                 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'):
        assert line in out.splitlines(), line
    srun = " ".join(out.split("srun ", 1)[1].replace("\\\n", " ").split())
    assert srun == ("--kill-on-bad-exit=1 torchrun --nnodes=2 --nproc-per-node=2 "
                    '--rdzv-backend=c10d --rdzv-endpoint="$head_addr:29411" '
                    '--rdzv-id="$SLURM_JOB_ID" --max-restarts=2 -m shardlab.train --config '
                    f"{job.resolve()}")
    lines = out.splitlines()
    exports = [i for i, line in enumerate(lines)
               if re.match(r"(# )?export (NCCL|TORCH)_", line)]
    assert len(exports) == 5  # four set, NCCL_SOCKET_IFNAME shown commented out
    assert all(lines[i - 1].startswith("# ") and len(lines[i - 1]) > 20 for i in exports)
    script = tmp_path / "job.sbatch"
    script.write_text(out)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # CPU ranks: no GPUs asked of Slurm, no NCCL
    _, cpu, _ = launch(capsys, str(job), "--nodes", "4", "--gpus-per-node", "1", "--emit",
                       "slurm", "--device", "cpu")
    assert "--gpus-per-node" not in cpu and "NCCL" not in cpu and "--nnodes=4" in cpu


def test_the_torchrun_commands(capsys: pytest.CaptureFixture[str], job: Path,
                               tmp_path: Path) -> None:
    code, out, _ = launch(capsys, str(job), "--nodes", "2", "--gpus-per-node", "2", "--emit",
                          "torchrun", "--out", str(tmp_path))
    assert code == 0 and out == f"wrote {tmp_path / 'job.torchrun'} (2 nodes x 2 ranks)\n"
    text = (tmp_path / "job.torchrun").read_text()
    first, second = commands(text)
    assert first == second and "# node 0 of 2" in text and "# node 1 of 2" in text
    assert first.startswith("NCCL_DEBUG=WARN ") and "--max-restarts=2" in first
    assert '--rdzv-endpoint="${MASTER_ADDR:?' in first and "--nproc-per-node=2" in first
    unset = subprocess.run(["bash", "-c", first], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "MASTER_ADDR"})
    assert unset.returncode != 0 and "set MASTER_ADDR" in unset.stderr
    _, given, _ = launch(capsys, str(job), "--nodes", "2", "--gpus-per-node", "2", "--emit",
                         "torchrun", "--host", "node-a", "--port", "1234", "--device", "cpu")
    assert "--rdzv-endpoint=node-a:1234 " in commands(given)[0] and "NCCL" not in given


@pytest.mark.parametrize(("argv", "needle"), [
    (["--nodes", "2", "--gpus-per-node", "4"], "nodes x gpus_per_node=8: must equal the 4 "
     "ranks"),
    (["--nodes", "3", "--gpus-per-node", "1"], "e.g. --nodes 4 --gpus-per-node 1"),
    (["--nodes", "1", "--gpus-per-node", "2", "--port", "70000"], "port=70000"),
    (["--nodes", "2", "--gpus-per-node", "2", "--out", "/no/such/dir/x"], "out="),
    (["--nodes", "1", "--gpus-per-node", "4", "--host", "$(reboot)"], "host='$(reboot)'"),
    (["--nodes", "1", "--gpus-per-node", "4", "--time", "1:00\n#SBATCH --x"], "time="),
])
def test_counts_that_do_not_give_the_world_are_refused(
        capsys: pytest.CaptureFixture[str], job: Path, tmp_path: Path, argv: list[str],
        needle: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    code, stdout, err = launch(capsys, str(job), "--emit", "slurm", *argv,
                               *([] if "--out" in argv else ["--out", str(out)]))
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("shardlab launch: error: ") and needle in err, err
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(("text", "needle"), [
    ("[layout]\ndp = 2\nfoo = 1\n", "layout.foo=1: unknown key in [layout]"),
    ("[layout]\ndp = 3\n[run]\nglobal_batch = 8\n", "global_batch=8: must be a multiple of "
     "dp (3)"),
    ("[model]\nname = \"llama-3-8b\"\nlayers = 2\n", "layers=2"),
    ("[run]\ngpu = \"no-such-gpu\"\n", "no-such-gpu"),
])
def test_a_job_train_would_refuse_is_refused_here(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path, text: str,
                                                  needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, out, err = launch(capsys, str(path), "--nodes", "1", "--gpus-per-node", "1",
                            "--emit", "torchrun")
    assert code == 2 and out == "" and needle in err and len(err.splitlines()) == 1, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.multiprocess
def test_two_nodes_from_the_emitted_commands_train_as_train_nproc_4(
        capsys: pytest.CaptureFixture[str], job: Path, tmp_path: Path) -> None:
    """About 50 s on 2 shared cores: 2 agents x 2 ranks, then the same job on 4 ranks."""
    code, _, err = launch(capsys, str(job), "--nodes", "2", "--gpus-per-node", "2", "--emit",
                          "torchrun", "--device", "cpu", "--port", str(free_port()),
                          "--out", str(tmp_path))
    assert code == 0, err
    lines = commands((tmp_path / "job.torchrun").read_text())
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    agents = [subprocess.Popen(["bash", "-c", f"{line} --json --log-dir "
                                + shlex.quote(str(tmp_path / f"n{i}"))],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)
              for i, line in enumerate(lines)]
    outs = []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=300)
            assert agent.returncode == 0, err[-3000:]
            outs.append(out)
    finally:  # a failed agent: its peer (and the ranks it started) go too
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    docs = [json.loads(o) for o in outs if o.strip()]
    assert len(docs) == 1 and docs[0]["world_size"] == 4 and len(docs[0]["losses"]) == 3
    # The same job from `shardlab train`, in this process, once the agents are done (run
    # beside them it saves nothing on two cores and crowds the rendezvous).
    code = main(["train", "--config", str(job), "--nproc", "4", "--json",
                 "--log-dir", str(tmp_path / "local")])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert json.loads(out)["losses"] == docs[0]["losses"]  # bitwise
