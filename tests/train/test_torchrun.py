"""``python -m shardlab.train`` under torchrun: two agents ("nodes") of one rank each meet
through c10d rendezvous on loopback and train as one job; only global rank 0 prints the
document, and its losses are those of the same job started by ``shardlab train``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shardlab.cli import main

pytest.importorskip("torch")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.multiprocess
def test_two_nodes_train_as_one_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    args = ["--dp", "2", "--steps", "3", "--json"]
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
         "--nproc-per-node", "1", "--node-rank", str(node), "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "shardlab-test",
         "-m", "shardlab.train", *args, "--log-dir", str(tmp_path / f"node{node}")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    outs = []
    for agent in agents:
        out, err = agent.communicate(timeout=240)
        assert agent.returncode == 0, err[-3000:]
        outs.append(out)
    docs = [json.loads(o) for o in outs if o.strip()]
    assert len(docs) == 1  # one document, from global rank 0, whichever node holds it
    doc = docs[0]
    assert doc["world_size"] == 2 and len(doc["losses"]) == 3
    for row in doc["comm_bytes_per_step"]:
        assert row["dp"]["measured"] == row["dp"]["predicted"]
    # The same job from `shardlab train`, in this process.
    capsys.readouterr()
    code = main(["train", *args, "--log-dir", str(tmp_path / "local")])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert json.loads(out)["losses"] == doc["losses"]  # the same job, bitwise
