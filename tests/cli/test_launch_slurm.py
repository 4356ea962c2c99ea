"""``shardlab launch --emit slurm`` against a real Slurm: Debian's slurm-wlm, slurmctld and
two slurmd on this host (nodes n1 and n2 at 127.0.0.1, one CPU rank each), the emitted
script submitted with ``sbatch --wait``: it must end with exit code 0 and rank 0's report.

``make test`` installs slurm-wlm when it can (root with apt-get); where it is missing, or
this is not root (slurmd starts the job's tasks as their user), the test is skipped with a
line that says why. The cluster's files and daemons live in the test's temporary folder
and end with it; no munge (auth/none) and no cgroups (the daemons may run in a container).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardlab.cli import main

DAEMONS = ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
CONF = """\
ClusterName=shardlab{tag}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1} CPUs={cpus} State=UNKNOWN
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A two-node Slurm on this host for one test: the environment its commands need."""
    if os.environ.get("SHARDLAB_SLURM_TEST") != "1":
        pytest.skip("slurm checks skipped: about 45 s of a real two-node Slurm, beyond "
                    "`make test`'s time budget; `make slurm-test` runs them")
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.skip(f"slurm checks skipped: {', '.join(missing)} not found (Debian: apt-get "
                    "install slurm-wlm; `make slurm-test` tries)")
    if os.geteuid() != 0:
        pytest.skip("slurm checks skipped: slurmd must run as root to start the job's tasks")
    root = tmp_path / "slurm"
    (root / "state").mkdir(parents=True)
    conf = root / "slurm.conf"
    conf.write_text(CONF.format(tag=os.getpid(), host=socket.gethostname(), root=root,
                                ctld=free_port(), n1=free_port(), n2=free_port(),
                                cpus=os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    daemons = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
               for cmd in (["slurmctld", "-D", "-c", "-f", str(conf)],
                           ["slurmd", "-D", "-f", str(conf), "-N", "n1"],
                           ["slurmd", "-D", "-f", str(conf), "-N", "n2"])]
    try:
        deadline = time.monotonic() + 30
        while True:
            states = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, text=True,
                                    capture_output=True).stdout.split()
            if states == ["idle", "idle"]:
                break
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                logs = "".join(p.read_text()[-800:] for p in root.glob("*.log"))
                pytest.fail(f"the test's Slurm did not come up (nodes {states}): {logs}")
            time.sleep(0.3)
        yield env
    finally:
        for d in daemons:  # the test's own daemons, by their process group
            if d.poll() is None:
                os.killpg(d.pid, 15)
        for d in daemons:
            try:
                d.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(d.pid, 9)
                d.wait()


@pytest.mark.multiprocess
def test_the_sbatch_script_runs_on_slurm(slurm: dict[str, str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """About 30 s: two slurmd, one job of 2 nodes x 1 CPU rank, 2 steps."""
    job = tmp_path / "job.toml"
    logs = tmp_path / "run"
    job.write_text(f'[model]\nlayers = 2\n[layout]\ndp = 2\n[run]\nsteps = 2\n'
                   f'log_dir = "{logs}"\n')
    code = main(["launch", str(job), "--nodes", "2", "--gpus-per-node", "1", "--emit", "slurm",
                 "--device", "cpu", "--port", str(free_port()), "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 0, err
    r = subprocess.run(["sbatch", "--wait", "job.sbatch"], cwd=tmp_path, env=slurm,
                       capture_output=True, text=True, timeout=300)
    out = "".join(p.read_text() for p in tmp_path.glob("shardlab-job-*.out"))
    assert r.returncode == 0, (r.stdout + r.stderr + out)[-4000:]
    assert "shardlab launch: 2 node(s) x 1 ranks, rendezvous at 127.0.0.1:" in out
    doc = json.loads((logs / "report.json").read_text())  # rank 0's, whichever node
    assert doc["world_size"] == 2 and len(doc["losses"]) == 2
