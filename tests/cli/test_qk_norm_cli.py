"""Qwen3's query/key norms (``ModelShape.qk_norm``): budget and plan price the shape, and
the runtime builds it (dry run here; train, simulate and export in their own tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardlab.cli import main


def test_dryrun_runs_a_qwen3_block_over_tensor_parallel_ranks(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Qwen3-8B's blocks (query/key norms, head_dim 128 where d_model / heads is too; 2 of
    its 36 layers, from a config.json) dry-run over dp 2 x tp 8 without sequence
    parallelism (the norms' gradients all-reduced over tp all the same; train's tests run
    it with sp): states, saved activations and every byte sent over dp and tp as the cost
    model says."""
    config = {"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 2,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "intermediate_size": 12288, "vocab_size": 151936,
              "max_position_embeddings": 40960, "tie_word_embeddings": False,
              "rope_theta": 1000000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["dryrun", str(path), "--gpus", "16", "--seq", "1024", "--layout",
                 "dp=2 tp=8 micro_batch=1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "qk_norm" in doc["model"]
    role = doc["roles"][0]
    for key in ("params", "grads", "optimizer"):
        assert role["ratio"][key] == 1.0, key
    assert 0.999 <= role["ratio"]["activations"] <= 1.01
    for dim in ("dp", "tp"):
        assert role["by_dim"][dim]["measured"] == role["by_dim"][dim]["predicted"], dim


def test_plan_prices_qwen3_235b_with_its_experts_folded(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The ModelZoo's TP 2 PP 8 EP 32 layout of Qwen3-235B-A22B on 256 H100s (EP > DP,
    Megatron-Core's folded expert mesh)."""
    assert main(["plan", "qwen3-235b-a22b", "--gpus", "256", "--global-batch", "2048",
                 "--seq", "4096", "--gpu", "h100", "--framework", "megatron", "--layout",
                 "dp=16 tp=2 pp=8 virtual=4 ep=32 etp=1 zero=1 sp=1 micro_batch=1 "
                 "dispatcher=flex", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    best = doc["best"][0]
    assert "qk_norm" in doc["model_shape"] and (best["ep"], best["dp"]) == (32, 16)
    assert best["breakdown"]["ep_comm"] > 0


def test_plan_for_this_machine_hands_over_a_train_command_for_it(
        capsys: pytest.CaptureFixture[str], cpu_home: Path, tmp_path: Path) -> None:
    """A tiny Qwen3 shape planned for this machine: priced, and each layout handed over as
    the `shardlab train` command that runs it (the runtime builds query/key norms)."""
    config = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64,
              "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["plan", str(path), "--gpu", "cpu", "--gpus", "2", "--global-batch", "8",
                 "--seq", "32", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"] and all(str(path) in b["train_command"] for b in doc["best"])
