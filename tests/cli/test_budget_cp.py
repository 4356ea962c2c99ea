"""``shardlab budget --cp / --stage-layers / --dp-replicate``: the flags, the JSON kinds and
one line on bad input."""

from __future__ import annotations

import json

import pytest

from shardlab.cli import main


def budget(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["budget", "llama-3-8b", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_flags_reach_the_layout_and_the_views(capsys: pytest.CaptureFixture[str]) -> None:
    doc = budget(capsys, "--gpus", "64", "--cp", "8", "--seq", "131072", "--pp", "2",
                 "--stage-layers", "15,17", "--zero", "3", "--dp-replicate", "2")
    lay = doc["layout"]
    assert (lay["dp"], lay["cp"], lay["pp"], lay["dp_replicate"], lay["dp_shard"]) == (
        4, 8, 2, 2, 2)
    assert lay["stage_layers"] == [15, 17] and "stage_layers=15+17" in lay["describe"]
    assert [s["layers"] for s in doc["memory"]["per_stage"]] == [15, 17]
    assert doc["comm"]["cp_bytes_per_step"] > 0 and doc["comm"]["dp_replica_bytes_per_step"] > 0
    assert main(["budget", "llama-3-8b", "--gpus", "64", "--cp", "8", "--seq", "131072",
                 "--zero", "3", "--dp-replicate", "2"]) == 0
    out = capsys.readouterr().out
    assert "Context parallel (cp=8" in out and "across HSDP replicas" in out
    assert "K/V bytes sent per step" in out


@pytest.mark.parametrize(("argv", "field"), [
    (["--gpus", "8", "--cp", "3", "--seq", "8190", "--tp", "1"], "gpus"),
    (["--gpus", "6", "--cp", "3", "--seq", "8192"], "cp"),
    (["--gpus", "8", "--pp", "2", "--stage-layers", "16,15"], "stage_layers"),
    (["--gpus", "8", "--pp", "2", "--stage-layers", "32,0"], "stage_layers"),
    (["--gpus", "8", "--pp", "2", "--stage-layers", "16,x"], "stage_layers"),
    (["--gpus", "8", "--stage-layers", "16,16"], "stage_layers"),
    (["--gpus", "8", "--zero", "3", "--dp-replicate", "3"], "dp_replicate"),
    (["--gpus", "8", "--dp-replicate", "2"], "dp_replicate"),
])
def test_bad_input_is_one_line_naming_the_field(capsys: pytest.CaptureFixture[str],
                                                 argv: list[str], field: str) -> None:
    assert main(["budget", "llama-3-8b", *argv]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and f"error: {field}=" in err


def test_a_bare_parameter_count_refuses_cp(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "--params", "7B", "--cp", "2"]) == 2
    assert "cp=2" in capsys.readouterr().err
