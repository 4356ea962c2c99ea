"""``shardlab plan`` with context parallelism, HSDP and uneven stages: the flags, the
``--layout`` keys, the cp column, and one line on bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shardlab.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_layout_keys_cp_stage_layers_and_dp_replicate(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "llama-3-8b", "--gpus", "64", "--seq", "32768",
                         "--global-batch", "16", "--layout", "dp=4 cp=2 pp=8 zero=1 "
                         "dp_replicate=2 stage_layers=3+4+4+4+4+4+4+5 schedule=1f1b", "--json")
    assert code == 0, err
    b = json.loads(out)["best"][0]
    assert (b["cp"], b["dp_replicate"], b["stage_layers"]) == (2, 2, [3, 4, 4, 4, 4, 4, 4, 5])
    assert b["breakdown"]["cp_comm"] > 0


def test_the_human_view_has_a_cp_column(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "llama-3-8b", "--gpus", "16", "--seq", "65536",
                         "--global-batch", "4", "--cp", "2,4", "--top", "2")
    assert code == 0, err
    assert "dp·cp·tp·pp" in out and re.search(r"┃\s+cp\s+┃", out)  # "where the step goes"


@pytest.mark.parametrize(("argv", "field"), [
    (["--cp", "3"], "cp"),
    (["--cp", "0"], "cp"),
    (["--dp-replicate", "0"], "dp_replicate"),
    (["--stage-layers", "16,15"], "stage_layers"),
    (["--stage-layers", "16,x"], "stage_layers"),
    (["--layout", "dp=4 cp=2 stage_layers=8+x"], "stage_layers"),
    (["--layout", "dp=2 pp=2 cp=2 stage_layers=20+12 zero=1 dp_replicate=3"], "dp_replicate"),
])
def test_bad_input_is_one_line_naming_the_field(capsys: pytest.CaptureFixture[str],
                                                 argv: list[str], field: str) -> None:
    code, out, err = run(capsys, "llama-3-8b", "--gpus", "8", "--global-batch", "8", *argv)
    assert code == 2 and not out and err.count("\n") == 1 and f"error: {field}=" in err


def test_this_machine_hands_train_its_cp(capsys: pytest.CaptureFixture[str],
                                         cpu_home: Path) -> None:
    """shardlab train runs context parallelism, HSDP and uneven stages now: a plan for this
    machine may pick them, and its command names them in train's own flags, which train's
    checks accept (no rank started here)."""
    from shardlab.cli import build_parser
    from shardlab.cli.train import check

    code, out, err = run(capsys, "--gpu", "cpu", "--gpus", "2", "--global-batch", "8",
                         "--cp", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    best = doc["best"][0]
    assert best["cp"] == 2 and best["dp"] * best["tp"] * best["pp"] * best["cp"] == 2
    command = best["train_command"] if "train_command" in best else doc["train_command"]
    assert command.endswith("--cp 2")
    cfg = check(build_parser().parse_args(command.split()[1:]))[0]
    assert cfg.cp == 2 and cfg.world == 2


@pytest.mark.parametrize("layout", ["dp=4 dp_replicate=2 zero=3", "dp=2 cp=2 zero=3"])
def test_a_given_layout_for_this_machine_hands_train_its_hsdp_or_cp(
        capsys: pytest.CaptureFixture[str], cpu_home: Path, layout: str) -> None:
    """`--layout` with HSDP or cp on this machine (refused until 2026-12-07, though the
    search itself kept them): the command names them, and train's checks accept it."""
    from shardlab.cli import build_parser
    from shardlab.cli.train import check

    code, out, err = run(capsys, "--gpu", "cpu", "--gpus", "4", "--global-batch", "8",
                         "--layout", layout, "--json")
    assert code == 0, err
    command = json.loads(out)["best"][0]["train_command"]
    cfg = check(build_parser().parse_args(command.split()[1:]))[0]
    assert (cfg.dp_replicate, cfg.cp) == ((2, 1) if "replicate" in layout else (1, 2))


def test_a_moe_plan_hands_train_the_model_it_priced(capsys: pytest.CaptureFixture[str],
                                                    cpu_home: Path) -> None:
    """A MoE (and query/key norms) from the shape flags: the command trains that model, with
    its experts (the flags were left out until 2026-12-07, so it trained a dense model), over
    HSDP at ep 1; with ep > 1 HSDP is not train's, and cp is not train's for a MoE."""
    from shardlab.cli import build_parser
    from shardlab.cli.train import check

    moe = ["--experts", "4", "--top-k", "2", "--shared-experts", "1", "--dense-layers", "1",
           "--qk-norm", "--kv-heads", "2", "--gpu", "cpu", "--gpus", "4", "--global-batch", "8"]
    code, out, err = run(capsys, *moe, "--layout", "dp=4 dp_replicate=2 zero=3", "--json")
    assert code == 0, err
    doc = json.loads(out)
    cfg = check(build_parser().parse_args(doc["best"][0]["train_command"].split()[1:]))[0]
    assert cfg.shape.describe() == doc["model_shape"] and cfg.dp_replicate == 2
    # HSDP with experts over ep, and cp of a MoE (each trains: tests/cli/test_train_cli.py)
    for layout in ("dp=4 dp_replicate=2 zero=3 ep=2", "dp=2 cp=2 zero=3"):
        code, out, err = run(capsys, *moe, "--layout", layout, "--json")
        assert code == 0, err
        command = json.loads(out)["best"][0]["train_command"]
        cfg = check(build_parser().parse_args(command.split()[1:]))[0]
        assert (cfg.dp_replicate, cfg.ep, cfg.cp) == ((2, 2, 1) if "ep" in layout
                                                      else (1, 1, 2))
    # but not an ep group across HSDP's replicas
    code, out, err = run(capsys, *moe, "--layout", "dp=4 dp_replicate=2 zero=3 ep=4")
    assert code == 2 and "not supported by shardlab train" in err, err
