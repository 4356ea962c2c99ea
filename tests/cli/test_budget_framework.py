"""``shardlab budget --framework``: the memory per device at a framework's peak, the same
bytes ``shardlab plan --layout ... --framework`` counts."""

from __future__ import annotations

import json

import pytest

from shardlab.cli import main

LAYOUT = ("--gpus", "8", "--zero", "3", "--recompute", "full", "--seq", "2048")


def doc_of(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("framework", ["torchtitan", "megatron"])
def test_budget_gives_the_plans_memory_at_the_frameworks_peak(
        capsys: pytest.CaptureFixture[str], framework: str) -> None:
    budget = doc_of(capsys, "budget", "llama-3-8b", *LAYOUT, "--framework", framework)
    plan = doc_of(capsys, "plan", "llama-3-8b", "--gpus", "8", "--global-batch", "8", "--seq",
                  "2048", "--layout", "dp=8 zero=3 micro_batch=1 recompute=full",
                  "--framework", framework)["best"][0]
    f = budget["memory"]["framework"]
    assert f["name"] == framework and f["source"]
    assert f["per_device"]["total"] == plan["memory_per_device"]
    for k, v in plan["memory_breakdown"].items():
        if k != "stage":
            assert f["per_device"][k] == v
    # Beyond the states and saved activations the budget counts: a transient peak, and
    # the budget's own figure is what it was without the flag.
    plain = doc_of(capsys, "budget", "llama-3-8b", *LAYOUT)
    assert f["per_device"]["transient"] > 0
    assert budget["memory"]["per_device"] == plain["memory"]["per_device"]
    assert "framework" not in plain["memory"]
    assert f["fits"] == (f["per_device"]["total"] <= budget["memory"]["capacity"])


def test_a_moe_budget_folds_the_experts_as_the_plan_does(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Mixtral, tp 4 x dp 2, ep 2 with whole experts: Megatron-Core folds the experts over
    the 8 ranks (each expert replicated 4 ways), as plan --framework megatron prices it;
    the budget's own figure keeps the ep group drawn from dp (shardlab train's)."""
    argv = ("--gpus", "8", "--tp", "4", "--ep", "2", "--etp", "1", "--zero", "1",
            "--sp", "--recompute", "full", "--seq", "4096", "--gpu", "h100")
    budget = doc_of(capsys, "budget", "mixtral-8x7b", *argv, "--framework", "megatron")
    plan = doc_of(capsys, "plan", "mixtral-8x7b", "--gpus", "8", "--global-batch", "2",
                  "--seq", "4096", "--gpu", "h100", "--layout",
                  "dp=2 tp=4 ep=2 etp=1 zero=1 sp=1 micro_batch=1 recompute=full",
                  "--framework", "megatron")["best"][0]
    f = budget["memory"]["framework"]["per_device"]
    assert f["optimizer"] == plan["memory_breakdown"]["optimizer"]
    assert f["optimizer"] < budget["memory"]["per_device"]["optimizer"]


def test_a_framework_without_memory_facts_adds_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    f = doc_of(capsys, "budget", "llama-3-8b", *LAYOUT, "--framework", "fsdp")["memory"][
        "framework"]
    assert f["per_device"]["transient"] == 0.0
    assert "no memory facts" in f["source"]


def test_the_human_budget_prints_the_frameworks_peak(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert main(["budget", "llama-3-8b", *LAYOUT, "--framework", "torchtitan"]) == 0
    out = capsys.readouterr().out
    assert "at torchtitan's peak (plan --framework)" in out and "per device, fits" in out


@pytest.mark.parametrize(("argv", "message"), [
    (("budget", "llama-3-8b", *LAYOUT, "--framework", "nemo"),
     "framework='nemo': must be one of megatron, torchtitan, fsdp, deepspeed"),
    (("budget", "--params", "7B", "--framework", "megatron"),
     "framework='megatron': needs a MODEL"),
    (("budget", "llama-3-70b", "--gpu", "h100", "--tp", "8", "--pp", "4", "--dp", "2",
      "--schedule", "zb-v", "--virtual-stages", "2", "--framework", "megatron"),
     "schedule='zb-v': --framework megatron runs 1f1b, interleaved-1f1b"),
    (("budget", "llama-3-70b", "--gpu", "h100", "--tp", "8", "--pp", "4", "--dp", "2",
      "--schedule", "zb-h2", "--framework", "torchtitan"),
     "schedule='zb-h2': --framework torchtitan runs gpipe, 1f1b"),
    (("budget", "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--zero", "1",
      "--framework", "torchtitan"), "zero=1: --framework torchtitan runs ZeRO 0, 2, 3"),
    (("budget", "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--cp", "2", "--seq", "8192",
      "--framework", "deepspeed"), "cp=2: --framework deepspeed runs no context parallelism"),
    (("budget", "llama-3-70b", "--gpu", "h100", "--tp", "8", "--pp", "4", "--dp", "2",
      "--virtual-stages", "2", "--framework", "deepspeed"),
     "schedule='interleaved-1f1b': --framework deepspeed runs 1f1b (virtual=2 makes it "
     "interleaved-1f1b)"),
])
def test_bad_framework_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                              argv: tuple[str, ...], message: str) -> None:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
