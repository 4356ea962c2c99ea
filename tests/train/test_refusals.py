"""``shardlab train`` refuses before any rank starts, one line and exit 2, nothing written:
a model the host's memory cannot hold (unless --allow-oversubscribe), a log or checkpoint
folder that is a file or cannot be written, a checkpoint folder another run holds, shape
flags beside MODEL or --init-from, --loss-parallel without tp, a .bin whose ids imply an
absurd vocabulary; and with pp > 1 the automatic micro-batch fills the schedule."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shardlab.cli import build_parser, guard, main
from shardlab.cli.train import check
from shardlab.errors import SpecError
from shardlab.train.config import auto_micro_batch
from shardlab.train.lock import LOCK_NAME, checkpoint_lock
from shardlab.train.report import predicted_peak_bytes
from shardlab.units import human_bytes

GB = 1e9


def refused(capsys: pytest.CaptureFixture[str], *argv: str, limit: float = 3) -> str:
    """Run ``shardlab train ARGV`` in this process; assert exit 2, no stdout, one line on
    stderr, under ``limit`` seconds (no rank started); return the line."""
    start = time.monotonic()
    code = main(["train", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert time.monotonic() - start < limit
    return err.strip()


def test_a_model_too_big_for_this_host_is_refused_with_both_figures(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setattr(guard, "available_memory_bytes", lambda: (24 * GB, "test"))
    logs = tmp_path / "logs"
    err = refused(capsys, "llama-3-8b", "--steps", "1", "--log-dir", str(logs))
    cfg, _, _ = check(build_parser().parse_args(
        ["train", "llama-3-8b", "--steps", "1", "--allow-oversubscribe"]))
    need = predicted_peak_bytes(cfg)  # weights, gradients, AdamW moments, activations
    assert need > 120 * GB  # 8B parameters x 16 bytes in fp32, at least
    assert err.startswith("shardlab train: error: memory=") and "llama-3-8b" in err
    assert human_bytes(need) in err and human_bytes(24 * GB) in err and "x 1" in err
    assert "--allow-oversubscribe" in err and not logs.exists()
    # two ranks of a small model, each within the host but not together
    small = check(build_parser().parse_args(["train", "--dp", "2"]))[0]
    per = predicted_peak_bytes(small)
    monkeypatch.setattr(guard, "available_memory_bytes", lambda: (per * 1.5, "test"))
    assert "x 2" in refused(capsys, "--dp", "2")
    check(build_parser().parse_args(["train", "--dp", "2", "--allow-oversubscribe"]))
    monkeypatch.setattr(guard, "available_memory_bytes", lambda: (per * 2.5, "test"))
    check(build_parser().parse_args(["train", "--dp", "2"]))  # 2 x per within 90%


def test_the_memory_refusal_comes_before_torch_is_imported() -> None:
    # The figure of issue 21: `train llama-3-8b --steps 1` on a 24 GB host, exit 2 in < 5 s.
    code = ("import sys\nfrom shardlab.cli import guard, main\n"
            "guard.available_memory_bytes = lambda: (24e9, 'test')\n"
            "code = main(['train', 'llama-3-8b', '--steps', '1'])\n"
            "print(code, 'torch' in sys.modules)\n")
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "memory=" in r.stderr
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("flag", ["--log-dir", "--checkpoint-dir"])
def test_a_folder_that_is_a_file_or_unwritable(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, flag: str) -> None:
    field = flag[2:].replace("-", "_")
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "is a file" in refused(capsys, flag, str(afile))
    assert f"{field}=" in refused(capsys, flag, str(afile / "below"))
    # sysfs: no folder can be made there, not even by root (whom no permission stops). Made
    # after every other check, once torch is imported for the launcher's signal handling
    # (about 5 s here when this process has not imported it yet).
    err = refused(capsys, flag, "/sys/shardlab-test-folder", limit=15)
    assert f"{field}='/sys/shardlab-test-folder': cannot be written" in err
    assert not Path("/sys/shardlab-test-folder").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written


def test_read_only_folder_is_refused_before_anything_is_made(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What os.access says of a read-only mount (EROFS), for a user it would stop.
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro
                        else real(p, mode))
    err = refused(capsys, "--log-dir", str(ro / "logs"))
    assert "cannot be written" in err and "read-only" in err
    assert list(ro.iterdir()) == []


def test_a_checkpoint_folder_in_use_is_refused(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with checkpoint_lock(ckpt):
        err = refused(capsys, "--checkpoint-dir", str(ckpt), "--log-dir",
                      str(tmp_path / "logs"))
        assert f"checkpoint_dir='{ckpt}'" in err and f"pid {os.getpid()}" in err
        assert sorted(p.name for p in ckpt.iterdir()) == [LOCK_NAME]
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(("argv", "words"), [
    (["llama-3-8b", "--d-model", "64"], "d_model=64: --d-model cannot be combined with MODEL"),
    (["llama-3-8b", "--style", "gpt"], "style='gpt'"),
    (["--init-from", "/nonexistent/import", "--layers", "2"],
     "layers=2: --layers cannot be combined with --init-from"),
    (["--init-from", "/nonexistent/import", "--vocab", "300"], "vocab=300"),
    (["--loss-parallel"], "loss_parallel=True: needs tp > 1"),
    (["--loss-parallel", "--dp", "2"], "loss_parallel=True: needs tp > 1"),
    (["--pp", "2", "--global-batch", "1"], "global_batch=1"),
])
def test_flags_that_would_be_ignored_or_fail_in_the_ranks(
        capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    assert words in refused(capsys, *argv)


def test_a_bin_whose_ids_imply_an_absurd_vocabulary(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    ids = np.random.default_rng(0).integers(0, 2**32, 4096, dtype=np.uint64).astype("<u4")
    data = tmp_path / "rand.bin"
    ids.tofile(data)
    err = refused(capsys, "--data", str(data), "--bin-dtype", "uint32")
    assert f"{int(ids.max()):,}" in err and "--bin-dtype" in err


def test_the_automatic_micro_batch_fills_the_pipeline() -> None:
    cfg, _, notes = check(build_parser().parse_args(["train", "--pp", "2"]))
    assert (cfg.micro_batch, cfg.microbatches) == (4, 2)
    assert notes == ["--micro-batch 0 with pp=2 (1f1b): 4 sequences per micro-batch, "
                     "2 micro-batches per step"]
    cfg, _, notes = check(build_parser().parse_args(["train", "--pp", "2", "--micro-batch",
                                                     "2"]))
    assert cfg.micro_batch == 2 and notes == []  # a micro-batch given is kept
    assert check(build_parser().parse_args(["train", "--dp", "2"]))[0].micro_batch == 0
    assert auto_micro_batch(12, 1, 4, "1f1b") == 3  # 4 micro-batches of 3
    assert auto_micro_batch(10, 1, 4, "1f1b") == 2  # 5 of 2: no 4 divides 10
    assert auto_micro_batch(12, 1, 4, "interleaved-1f1b") == 3
    assert auto_micro_batch(24, 2, 2, "gpipe") == 6
    with pytest.raises(SpecError, match="a multiple of pp"):
        auto_micro_batch(10, 1, 4, "interleaved-1f1b")
    interleaved = ["train", "--pp", "2", "--schedule", "interleaved-1f1b",
                   "--virtual-stages", "2", "--global-batch", "6"]
    cfg = check(build_parser().parse_args(interleaved))[0]
    assert cfg.microbatches % 2 == 0 and cfg.micro_batch * cfg.microbatches == 6

