"""``shardlab train``'s human view, in one process: what it prints, its step log, and the
TensorBoard files of the same run. (The parity runs: ``test_train_cli.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardlab.cli import main


def test_human_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The human view, the step log, and the TensorBoard files of the same run: rank 0's
    scalars every step, the launcher's summary (memory, bytes per dim) at the end."""
    pytest.importorskip("torch")
    from shardlab.train.tensorboard import read_scalars

    board = tmp_path / "tb"
    code = main(["train", "--steps", "3", "--log-dir", str(tmp_path), "--tensorboard",
                 str(board)])
    out = capsys.readouterr().out
    assert code == 0 and "Training" in out and "State bytes per rank" in out
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[-1])["step"] == 2
    seen = read_scalars(board)
    logged = [json.loads(line) for line in lines]
    assert [s for s, _ in seen["train/loss"]] == [0, 1, 2]
    for (_, loss), rec in zip(seen["train/loss"], logged, strict=True):
        assert loss == pytest.approx(rec["loss"], rel=1e-6)  # float32 on disk
    doc = json.loads((tmp_path / "report.json").read_text())
    held = doc["memory_per_rank"][0]["measured"]["params"]
    assert seen["memory/rank0/weights"] == [(doc["measured_step"], pytest.approx(held))]
