"""``shardlab train --checkpoint-dir / --resume / --max-restarts`` end to end: a job that
fails restarts by itself from its last checkpoint, a data-parallel checkpoint continues
on one process, and bad checkpoints are refused before any rank starts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from shardlab.cli import main
from shardlab.cli.train import _print_checkpoints
from shardlab.config.model import ModelShape
from shardlab.distributed import checkpoint_async
from shardlab.distributed.launch import RankContext
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.train.config import TrainConfig
from shardlab.train.loop import train_rank

TINY = ["--layers", "2", "--d-model", "32", "--steps", "4", "--checkpoint-every", "2"]


def shardlab(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardlab", *argv], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.multiprocess
def test_restart_resume_on_one_process_and_bad_checkpoints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "ckpt"
    # rank 0 raises once 3 steps are done; the job restarts from step-2 and finishes
    r = shardlab("train", "--dp", "2", *TINY, "--checkpoint-dir", str(ckpt),
                 "--fail-at-step", "3", "--fail-rank", "0", "--max-restarts", "1",
                 "--check-parity", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rank 0 failed: RuntimeError: fault injected on rank 0 at step 3" in r.stderr
    assert "restart 1 of 1 from step-2" in r.stderr
    doc = json.loads(r.stdout)
    info = doc["checkpoint"]
    assert info["resumed_at_step"] == 2 and len(info["restarts"]) == 1
    assert info["kept"] == [2, 4] and doc["max_loss_diff"] <= 1e-5  # fp32 parity
    assert info["async"] is False  # an injected fault saves synchronously

    # dp=2 -> one process: resharded on load, the loss within the parity tolerance (in this
    # process: the run above was the real `python -m shardlab` one)
    one = tmp_path / "one"
    one.mkdir()
    shutil.copytree(ckpt / "step-2", one / "step-2")
    code = main(["train", *TINY, "--checkpoint-dir", str(one), "--resume", "--check-parity",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    doc = json.loads(out)
    assert doc["world_size"] == 1 and doc["checkpoint"]["resumed_at_step"] == 2
    assert doc["checkpoint"]["async"] is True  # step 4 was saved in the background
    assert doc["max_loss_diff"] <= 1e-5

    # bad input: one line, exit 2, before any rank (fast), nothing written
    before = sorted(p.name for p in ckpt.iterdir())
    for argv, words in [
        (["--resume", "3"], "resume=3: no checkpoint at that step"),
        (["--resume", "x"], "resume='x'"),
        (["--resume", "--d-model", "64"], "d_model=64: differs from the checkpoint's"),
        (["--resume", "--global-batch", "16"], "global_batch=16"),
        (["--resume", "--steps", "4"], "steps=4: must be more than the checkpoint's step"),
    ]:
        start = time.monotonic()
        base = [a for a in TINY if a not in ("--steps", "4")] + ["--steps", "6"]
        code = main(["train", *base, *argv, "--checkpoint-dir", str(ckpt)])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert words in err, err
        assert time.monotonic() - start < 5
    assert sorted(p.name for p in ckpt.iterdir()) == before
    (ckpt / "step-4" / "__0_0.distcp").write_bytes(b"corrupt")
    assert main(["train", *TINY[:-2], "--steps", "6", "--checkpoint-dir", str(ckpt),
                 "--resume"]) == 2
    assert "__0_0.distcp" in capsys.readouterr().err
    assert main(["train", "--resume"]) == 2
    assert "needs --checkpoint-dir" in capsys.readouterr().err


def test_the_async_label_says_what_the_saves_did(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run that asks for background saves (the default) on a host short of memory saves
    synchronously, and its rank reports that, not the request; the summary line then
    says nothing of async (one rank in this process, one step)."""
    monkeypatch.setattr(checkpoint_async, "available_memory_bytes",
                        lambda: (1000.0, "test"))
    shape = ModelShape("tiny", 2, 32, 4, garden_vocab().size, 32, style="llama", tied=False)
    cfg = TrainConfig(shape=shape, steps=1, docs=garden_documents(20, 0),
                      checkpoint_dir=str(tmp_path))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rank = train_rank(RankContext(0, 1, 0, "cpu", "gloo", 30.0), cfg)
    finally:
        dist.destroy_process_group()
    assert cfg.async_save and rank["checkpoint_async"] is False
    assert "saved synchronously" in capsys.readouterr().err
    info = {"dir": "D", "resumed_from": None, "restarts": [], "kept": [1],
            "save_seconds": rank["checkpoint_seconds"]}
    for ran, label in [(rank["checkpoint_async"], ""), (True, " (async)")]:
        _print_checkpoints({**info, "async": ran})
        assert capsys.readouterr().out.endswith(f" s{label}\n")


@pytest.mark.multiprocess
def test_an_fp8_gathering_run_resumes_bitwise(tmp_path: Path) -> None:
    """torchao's fp8 linears with fp8 gathers (torch's CPU fp8 matmul): the checkpoint of
    step 2, saved in step as such runs save, resumes to the uninterrupted run's losses
    bit for bit (an async save once gave weights near 1e37 and a NaN loss on resume)."""
    fp8 = ["--dp", "2", "--layers", "2", "--d-model", "64", "--dtype", "fp8", "--fp8-on-cpu",
           "--fp8-all-gather", "--steps", "4", "--checkpoint-every", "2", "--json"]
    whole = shardlab("train", *fp8, "--checkpoint-dir", str(tmp_path / "a"))
    assert whole.returncode == 0, whole.stderr
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "step-2", tmp_path / "b" / "step-2")
    resumed = shardlab("train", *fp8, "--checkpoint-dir", str(tmp_path / "b"), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    losses = json.loads(whole.stdout)["losses"]
    assert json.loads(resumed.stdout)["losses"] == losses and len(losses) == 4
    assert all(x == x and x < 10 for x in losses)  # finite
