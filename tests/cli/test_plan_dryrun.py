"""``shardlab plan --dry-run-top K``: the K fastest layouts that fit are dry-run (every
role), marked where the real program's peak exceeds the device, and moved below the
others; the search keeps to what ``shardlab train`` runs. The dry runs themselves are
stood in for here (``tests/cli/test_dryrun_cli.py`` and the agreement test in
``tests/cli/test_train_cli.py`` run real ones)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shardlab.cli import main
from shardlab.dryrun import pool


def fake_role(cfg: Any, rank: int, peak: float) -> dict[str, Any]:
    """What ``run_role`` returns, with the figures a dry run of ``peak`` bytes gives."""
    by = {"params": 1.0, "grads": 1.0, "optimizer": 2.0, "activations": peak - 5.0,
          "temporaries": 1.0}
    pp_rank, rest = divmod(rank, cfg.dp * cfg.tp)
    return {"rank": rank, "pp_rank": pp_rank, "dp_rank": rest // cfg.tp,
            "tp_rank": rest % cfg.tp, "stages": [pp_rank], "layers": 1, "peak_bytes": peak,
            "by_category": by, "by_tracker": {}, "peak_at": {"phase": "", "module": ""},
            "activation_peak_bytes": peak - 5.0, "saved_bytes_per_microbatch": 1,
            "state_bytes": {"params": 1, "grads": 1, "optimizer": 2, "total": 4},
            "comm_step": {"by_dim": {}}, "flops_by_op": {"mm": 10}, "seconds": 1.0}


def test_layouts_whose_dry_run_does_not_fit_move_down(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def fake_many(work: list[Any], jobs: int | None = None) -> list[dict[str, Any]]:
        calls.append(work)
        first = work[0][0]  # the planner's fastest layout: its dry run does not fit
        return [fake_role(cfg, rank, 1e12 if cfg is first else 1e6) for cfg, rank in work]

    monkeypatch.setattr(pool, "run_many", fake_many)
    assert main(["plan", "--gpus", "4", "--global-batch", "8", "--gpu", "h100", "--top", "4",
                 "--dry-run-top", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dry_run_top"] == 2 and len(calls) == 1
    dry = [b.get("dry_run") for b in doc["best"]]
    ran = [d for d in dry if d is not None and "skipped" not in d]
    assert len(ran) == 2 and sorted(d["fits"] for d in ran) == [False, True]
    assert dry[-1] is not None and dry[-1]["fits"] is False  # the one that did not fit, last
    assert dry[-1]["peak_bytes"] == 1e12 and dry[-1]["allowance_bytes"] > 1e9
    for b in doc["best"]:  # what train runs: ZeRO 0/2/3 and its schedules only
        assert b["zero"] in (0, 2, 3) and b["schedule"] in ("gpipe", "1f1b",
                                                            "interleaved-1f1b")
    assert main(["plan", "--gpus", "4", "--global-batch", "8", "--gpu", "h100", "--top", "4",
                 "--dry-run-top", "2"]) == 0
    out = capsys.readouterr().out
    assert "dry run" in out and " NO" in out and " ok" in out


def test_dry_run_top_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", "--gpus", "4", "--global-batch", "8", "--dry-run-top", "0"])
    assert e.value.code == 2


def test_an_fp8_plan_dry_runs_the_fp8_program(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``--dtype fp8``: the dry runs are of train's fp8 program, a tensor-parallel layout's
    too (torchao's float8 tensor-parallel styles)."""
    seen: list[Any] = []

    def fake_many(work: list[Any], jobs: int | None = None) -> list[dict[str, Any]]:
        seen.extend(cfg for cfg, _ in work)
        return [fake_role(cfg, rank, 1e6) for cfg, rank in work]

    monkeypatch.setattr(pool, "run_many", fake_many)
    assert main(["plan", "--gpus", "8", "--global-batch", "8", "--gpu", "h100", "--top", "8",
                 "--dtype", "fp8", "--dry-run-top", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert seen and {cfg.dtype for cfg in seen} == {"fp8"} and doc["best"][0]["dry_run"]
    assert main(["plan", "--gpus", "8", "--global-batch", "8", "--gpu", "h100", "--dtype",
                 "fp8", "--layout", "dp=4 tp=2 zero=3", "--dry-run-top", "1", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)["best"][0]
    assert "skipped" not in entry["dry_run"] and (seen[-1].dtype, seen[-1].tp) == ("fp8", 2)
    # ZeRO-3's gathers in fp8, as the plan prices them; ZeRO-2's bf16.
    assert seen[-1].fp8_all_gather
    assert main(["plan", "--gpus", "8", "--global-batch", "8", "--gpu", "h100", "--dtype",
                 "fp8", "--layout", "dp=4 tp=2 zero=2", "--dry-run-top", "1", "--json"]) == 0
    capsys.readouterr()
    assert not seen[-1].fp8_all_gather


@pytest.mark.parametrize(("framework", "recompute"), [([], "selective"),
                                                     (["--framework", "torchtitan"], "op")])
def test_torchtitans_selective_layouts_dry_run_per_operator(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        framework: list[str], recompute: str) -> None:
    """Under ``--framework torchtitan`` a selective layout is priced as per-operator
    checkpointing, so its dry run is train's ``recompute=op``; without it, Korthikanti's."""
    seen: list[Any] = []

    def fake_many(work: list[Any], jobs: int | None = None) -> list[dict[str, Any]]:
        seen.extend(cfg for cfg, _ in work)
        return [fake_role(cfg, rank, 1e6) for cfg, rank in work]

    monkeypatch.setattr(pool, "run_many", fake_many)
    assert main(["plan", "--gpus", "4", "--global-batch", "8", "--gpu", "h100", *framework,
                 "--layout", "dp=4 zero=3 recompute=selective", "--dry-run-top", "1",
                 "--json"]) == 0
    capsys.readouterr()
    assert [cfg.recompute for cfg in seen] == [recompute]


def test_a_ddp_layout_is_skipped_with_the_reason(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP (ZeRO 0) over several ranks cannot run on fake tensors (its C++ reducer needs
    storage): the entry says so and no dry run is started for it."""
    seen: list[Any] = []

    def fake_many(work: list[Any], jobs: int | None = None) -> list[dict[str, Any]]:
        seen.extend(work)
        return [fake_role(cfg, rank, 1e6) for cfg, rank in work]

    monkeypatch.setattr(pool, "run_many", fake_many)
    assert main(["plan", "--gpus", "4", "--global-batch", "8", "--gpu", "h100",
                 "--layout", "dp=4 zero=0", "--dry-run-top", "1", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)["best"][0]
    assert entry["zero"] == 0 and not seen
    assert "DDP's C++ reducer needs real tensors" in entry["dry_run"]["skipped"]


def test_a_mixture_of_experts_plan_dry_runs_its_expert_parallel_layout(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A MoE plan's layout is dry-run for real (no stand-in): train's expert-parallel
    program routed contiguously (its counts known without values; a learned router's
    could not be read from fake tensors), its states the cost model's; a plan priced for
    a routing imbalance says the dry run's is balanced."""
    assert main(["plan", "--experts", "4", "--top-k", "2", "--gpus", "4", "--global-batch",
                 "8", "--seq", "32", "--gpu", "h100", "--layout", "dp=4 ep=2 zero=3",
                 "--routing-imbalance", "2", "--dry-run-top", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("--routing-imbalance 2 is in its figures, not in the dry-run peaks" in n
               for n in doc["notes"])
    entry = doc["best"][0]
    assert entry["ep"] == 2 and entry["dry_run"]["fits"]
    for key in ("params", "grads", "optimizer"):
        assert entry["dry_run"]["ratio"][key] == 1.0, key
    assert 0.99 <= entry["dry_run"]["ratio"]["activations"] <= 1.01
