"""``shardlab report``: pages and figure files written whole; bad input is one line, exit 2,
and nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardlab.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_budget_page_escapes_a_hostile_model_name(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((ROOT / "tests/config/data/hf/gpt2.json").read_text())
    config["_name_or_path"] = '<script>alert("x")</script>&$\\frac{a}{b}$'
    (tmp_path / "config.json").write_text(json.dumps(config))
    out, figs = tmp_path / "b.html", tmp_path / "figs"
    assert main(["report", "budget", str(tmp_path / "config.json"), "--gpus", "4",
                 "--zero", "3", "-o", str(out), "--figures", str(figs)]) == 0
    html = out.read_text()
    assert "<script" not in html and "&lt;script&gt;alert(&quot;x&quot;)" in html
    names = {"budget-params", "budget-memory", "budget-roofline", "budget-decode"}
    assert sorted(p.name for p in figs.iterdir()) == sorted(
        f"{n}.{x}" for n in names for x in ("png", "svg"))
    assert all(p.stat().st_size > 1000 for p in figs.iterdir())
    assert html.count("data-chart=") == 4  # one pipeline stage: no per-stage chart
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {out} (") and "4 charts" in said and "8 figure files" in said


def test_budget_page_takes_the_cluster_facts_budget_takes(tmp_path: Path) -> None:
    # A 500 W cap: the page's peak is the capped one, as `shardlab budget` prints it.
    out = tmp_path / "b.html"
    assert main(["report", "budget", "llama-3-8b", "--gpus", "8", "--power-cap-w", "500",
                 "--nics-per-node", "4", "--nic-gbps", "100", "-o", str(out)]) == 0
    assert "884.07 TFLOP/s dense bf16" in out.read_text()  # 989 x (500/700)^(1/3)


def test_plan_page(tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    assert main(["report", "plan", "gpt3-175b", "--gpus", "1024", "--global-batch", "1536",
                 "-o", str(out)]) == 0
    html = out.read_text()
    assert 'data-chart="plan-timeline"' in html and "Rejected layouts" in html


@pytest.mark.parametrize(("argv", "message"), [
    (["budget", "llama-3-9b"], "model='llama-3-9b': unknown"),
    (["budget", "gpt2", "--tp", "5"], "tp=5"),
    (["budget", "gpt2", "-o", "{tmp}/no/such/b.html"], "does not exist"),
    (["budget", "gpt2", "-o", "{tmp}"], "must be a file path, not a folder"),
    (["budget", "gpt2", "-o", "{tmp}/b.html", "--figures", "{tmp}/file"], "a file is there"),
    (["plan", "gpt2", "--gpus", "8", "--global-batch", "8", "--gpu", "nope", "-o",
      "{tmp}/p.html"], "gpu="),
    (["run", "{tmp}"], "no report.json and no step records"),
    (["run", "{tmp}/missing"], "no such file or folder"),
    (["run", "{tmp}/file"], "file line 1 is not a step record"),
])
def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                   message: str) -> None:
    (tmp_path / "file").write_text("x")
    before = sorted(os.listdir(tmp_path))
    assert main(["report", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardlab report: error: ") and message in err, err
    assert err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, not even a temp file


def test_a_kind_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["report"])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_a_binary_step_log_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"model": "m", "layout": "dp2", "world_size": 2, "losses": [1.0], "tokens_per_s": 1.0,
           "step_seconds": 1.0, "memory_per_rank": [], "predicted_vs_measured": {}}
    (tmp_path / "report.json").write_text(json.dumps(doc))
    (tmp_path / "train.jsonl").write_bytes(bytes(range(255, -1, -1)))
    before = sorted(os.listdir(tmp_path))
    assert main(["report", "run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"shardlab report: error: run_dir='{tmp_path}': train.jsonl line ")
    assert "is not UTF-8 text" in err and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == before
