"""The TensorBoard event files a run writes, read back record by record."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardlab.config.model import ModelShape
from shardlab.estimate.flops import flops_per_token
from shardlab.train.tensorboard import RunBoard, read_scalars

SHAPE = ModelShape("tiny", 2, 32, 4, 64, 16)


def test_steps_and_the_run_document(tmp_path: Path) -> None:
    board = RunBoard(tmp_path, SHAPE, seq=16, peak_flops=1e9)
    board.step(0, loss=4.0, grad_norm=2.0, lr=1e-3, seconds=0.5, tokens=128)
    board.step(1, loss=3.5, grad_norm=1.5, lr=2e-3, seconds=0.25, tokens=128)
    # Written and flushed per step: a dashboard sees the run while it trains.
    seen = read_scalars(tmp_path)
    assert seen["train/loss"] == [(0, 4.0), (1, 3.5)]
    assert seen["train/tokens_per_s"] == [(0, 256.0), (1, 512.0)]
    mfu = flops_per_token(SHAPE, 16).train * 512 / 1e9
    assert seen["train/mfu"][1][1] == pytest.approx(mfu, rel=1e-6)  # float32 on disk
    doc = {"measured_step": 1, "tokens_per_s": 500.0, "mfu": 0.25,
           "memory_per_rank": [{"rank": 0,
                                "measured": {"params": 10, "grads": 10, "optimizer": 20},
                                "predicted": {"weights": 10, "gradients": 10, "optimizer": 20},
                                "activations": {"measured": 7.0, "predicted": 8.0}}],
           "comm_bytes_per_step": [{"rank": 0, "dp": {"predicted": 96.0, "measured": 96.0}}]}
    board.finish(doc)
    board.close()
    seen = read_scalars(tmp_path)
    assert seen["memory/rank0/optimizer"] == [(1, 20.0)]
    assert seen["predicted/memory/rank0/activations"] == [(1, 8.0)]
    assert seen["comm/rank0/dp"] == seen["predicted/comm/rank0/dp"] == [(1, 96.0)]
    assert seen["run/mfu"] == [(1, 0.25)]


def test_no_peak_no_mfu(tmp_path: Path) -> None:
    board = RunBoard(tmp_path, SHAPE, seq=16, peak_flops=None)
    board.step(0, loss=4.0, grad_norm=2.0, lr=1e-3, seconds=0.5, tokens=128)
    board.close()
    seen = read_scalars(tmp_path)
    assert "train/mfu" not in seen and seen["train/lr"] == [(0, pytest.approx(1e-3))]
