"""A run directory read back: what is not one is refused in one line; a real run's figures
are the ones its report.json holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shardlab.cli import main
from shardlab.errors import SpecError
from shardlab.report.run_html import comparison_rows, load_run, per_step, run_sections


@pytest.mark.parametrize(("report", "message"), [
    (None, "no report.json"),
    ("{not json", "cannot be read"),
    ('{"losses": [1.0]}', "missing model"),
    ("[1, 2]", "not a train report"),
])
def test_not_a_run_directory(tmp_path: Path, report: str | None, message: str) -> None:
    if report is not None:
        (tmp_path / "report.json").write_text(report)
    with pytest.raises(SpecError, match=message):
        load_run(tmp_path)
    with pytest.raises(SpecError, match="no such file or folder"):
        load_run(tmp_path / "nothing")


MINIMAL = {"model": "m", "layout": "dp2", "world_size": 2, "losses": [1.0], "tokens_per_s": 1.0,
           "step_seconds": 1.0, "memory_per_rank": [], "predicted_vs_measured": {}}
"""The keys load_run asks of a report.json, and nothing else."""


def test_a_file_is_read_as_a_step_log(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps(MINIMAL))
    with pytest.raises(SpecError, match=r"report\.json line 1 is not a step record"):
        load_run(tmp_path / "report.json")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SpecError, match="this file has no step records"):
        load_run(tmp_path / "empty.jsonl")


@pytest.mark.parametrize(("name", "data", "message"), [
    ("train.jsonl", b"\x89PNG\r\n\x1a\n\x00\xff", r"train\.jsonl line 1 is not UTF-8 text "
     r"\(byte 0x89\)"),
    ("train.jsonl", b'{"step": 0, "seconds": 1, "tokens": 8, "loss": 2.0}\n\xff\xfe\n',
     r"train\.jsonl line 2 is not UTF-8"),
    ("train.jsonl", b"x" * 70_000, r"train\.jsonl line 1 is longer than 65,536 bytes"),
    ("report.json", b"\x89PNG\r\n\x1a\n\x00\xff", r"report\.json is not UTF-8 text \(byte 0 "
     r"is 0x89\)"),
], ids=["binary-log", "binary-second-line", "huge-line", "binary-report"])
def test_a_binary_file_is_named(tmp_path: Path, name: str, data: bytes, message: str) -> None:
    (tmp_path / "report.json").write_text(json.dumps(MINIMAL))
    (tmp_path / name).write_bytes(data)
    with pytest.raises(SpecError, match=message):
        load_run(tmp_path)


def test_a_bad_step_log_is_named(tmp_path: Path, run_dir: Path) -> None:
    shutil.copy(run_dir / "report.json", tmp_path)
    (tmp_path / "train.jsonl").write_text('{"step": 0, "seconds": 1, "tokens": 8, "loss": 2}\n'
                                          '{"step": 1}\n')
    with pytest.raises(SpecError, match=r"train\.jsonl line 2"):
        load_run(tmp_path)


@pytest.mark.multiprocess
def test_a_real_run(run_dir: Path) -> None:
    run = load_run(run_dir)
    doc = run["doc"]
    assert len(run["steps"]) == len(doc["losses"]) == 4
    ps = per_step(run)
    assert ps["step"] == [0, 1, 2, 3]
    tokens = run["steps"][0]["tokens"]
    assert ps["tokens_per_s"][2] == pytest.approx(tokens / run["steps"][2]["seconds"])
    rows = comparison_rows(doc)
    assert rows[0][0].startswith("FLOPs per step")
    states = [r for r in rows if "optimizer bytes" in r[0]]
    assert len(states) == 2 and all(r[1] == r[2] and r[3] == "1.000" for r in states)
    plan = {"step_seconds": doc["step_seconds"] / 2, "mfu": 2 * doc["mfu"]}
    last = comparison_rows(doc, plan)[-2:]
    assert [r[3] for r in last] == ["2.000", "0.500"]
    sections = run_sections(run, prefix="r")
    assert [c.name for s in sections for c in s.charts] == ["r-loss", "r-speed", "r-memory"]
    assert "one process (reference)" in sections[1].charts[0].svg


@pytest.mark.multiprocess
def test_report_run_writes_beside_the_run(tmp_path: Path, run_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "copy"
    shutil.copytree(run_dir, d)
    doc = json.loads((d / "report.json").read_text())
    doc["mfu"] = doc["hfu"] = None  # a run without a known peak
    (d / "report.json").write_text(json.dumps(doc))
    (d / "train.jsonl").unlink()
    assert main(["report", "run", str(d)]) == 0
    html = (d / "report.html").read_text()
    assert "unknown (no peak" in html and "No train.jsonl" in html
    assert html.count("data-chart=") == 2  # loss and memory; no per-step log
    assert capsys.readouterr().out.startswith(f"wrote {d / 'report.html'}")
    assert main(["report", "run", str(d), "-o", str(d / "report.json")]) == 2
    assert "would overwrite the run's own data" in capsys.readouterr().err


STEPS = [{"step": i, "loss": 3.0 - 0.5 * i, "grad_norm": 1.0, "lr": 1e-3, "seconds": 0.5 + i,
          "tokens": 64, "real_tokens": 60} for i in range(3)]


@pytest.mark.parametrize("given", ["file", "folder"])
def test_a_step_log_alone(tmp_path: Path, given: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A run still training (no report.json yet): its train.jsonl, given as the file or as
    the folder, makes the loss and tokens/s page."""
    log = tmp_path / "train.jsonl"
    log.write_text("".join(json.dumps(s) + "\n" for s in STEPS))
    run = load_run(log if given == "file" else tmp_path)
    assert run["doc"] is None and run["steps"] == STEPS and run["log"] == str(log)
    sections = run_sections(run, prefix="r")
    assert [c.name for s in sections for c in s.charts] == ["r-loss", "r-speed"]
    text = "".join(b for s in sections for b in s.blocks)
    assert "3.0000 / 2.0000" in text  # first / last loss
    assert "34.13" in text  # median tokens/s of steps 1 and 2: (64/1.5 + 64/2.5) / 2
    assert main(["report", "run", str(log if given == "file" else tmp_path)]) == 0
    assert (tmp_path / "report.html").is_file()
    assert main(["report", "run", str(log), "-o", str(log)]) == 2
    assert "would overwrite the run's own data" in capsys.readouterr().err
