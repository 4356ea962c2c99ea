"""Qwen3's query/key norms: budget and plan price the shape, the runtime's commands refuse
it on one line before any process starts (``ModelShape.qk_norm``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardlab.cli import main


@pytest.mark.parametrize("argv", [
    ["train", "qwen3-8b", "--dp", "2", "--steps", "1"],
    ["dryrun", "qwen3-8b", "--gpus", "8"],
    ["simulate", "qwen3-8b", "--dp", "2"],
])
def test_the_runtime_refuses_query_key_norms(capsys: pytest.CaptureFixture[str],
                                             argv: list[str]) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "qk_norm=True: qwen3-8b: shardlab's model has no query/key" \
        in lines[0]


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


def test_plan_for_this_machine_hands_over_no_train_command_for_it(
        capsys: pytest.CaptureFixture[str], cpu_home: Path, tmp_path: Path) -> None:
    """A tiny Qwen3 shape planned for this machine: priced, but no `shardlab train` command,
    which would refuse it."""
    config = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64,
              "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["plan", str(path), "--gpu", "cpu", "--gpus", "2", "--global-batch", "8",
                 "--seq", "32", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"] and all(b["train_command"] is None for b in doc["best"])
