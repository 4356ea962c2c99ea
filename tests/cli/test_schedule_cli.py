"""``shardlab schedule`` from the command line: JSON fields, pictures, --kind all, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardlab.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schedule", "--kind", "1f1b", "--stages", "4", "--microbatches",
                       "8", "--activation-bytes", "1e9", "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["makespan"] == 33 and doc["bubble"] == pytest.approx(3 / 11)
    assert doc["peak_inflight"] == [4, 3, 2, 1]
    assert doc["peak_activation_bytes"] == [4e9, 3e9, 2e9, 1e9]
    assert len(doc["bubble_per_rank"]) == 4 and doc["closed_form"]["bubble"] == 3 / 11
    first = doc["timeline"][0][0]
    assert set(first) >= {"start", "end", "kind", "microbatch", "chunk"}
    assert (first["start"], first["kind"], first["microbatch"], first["chunk"]) == (0, "F", 0, 0)
    assert sum(len(r) for r in doc["timeline"]) == 4 * 8 * 2


def test_durations_and_latency(capsys: pytest.CaptureFixture[str]) -> None:
    base = json.loads(run(capsys, "schedule", "--kind", "gpipe", "--stages", "2",
                          "--microbatches", "2", "--json")[1])
    slow = json.loads(run(capsys, "schedule", "--kind", "gpipe", "--stages", "2",
                          "--microbatches", "2", "--t-fwd", "2", "--p2p", "0.5", "--json")[1])
    assert slow["makespan"] > base["makespan"]


def test_kind_all_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schedule", "--kind", "all", "--stages", "4", "--microbatches", "6",
                       "--json")
    rows = {r["kind"]: r for r in json.loads(out)["schedules"]}
    assert code == 0 and len(rows) == 7
    assert "multiple of stages" in rows["interleaved-1f1b"]["error"]  # 6 % 4 != 0
    assert "2*stages" in rows["dualpipev"]["error"]
    assert rows["zb-h2"]["bubble"] < rows["1f1b"]["bubble"]
    code, out, _ = run(capsys, "schedule", "--kind", "all", "--stages", "4", "--microbatches", "8")
    assert code == 0 and all(k in out for k in ("gpipe", "zb-v", "dualpipev"))


def test_human_view_and_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png, svg, trace = tmp_path / "s.png", tmp_path / "s.svg", tmp_path / "s.json"
    code, out, err = run(capsys, "schedule", "--kind", "zb-v", "--stages", "2", "--microbatches",
                         "4", "--png", str(png), "--svg", str(svg), "--trace", str(trace))
    assert code == 0 and err == ""
    assert "r0" in out and "r1" in out and "bubble" in out
    assert png.stat().st_size > 0 and svg.stat().st_size > 0
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.parametrize(("argv", "words"), [
    (["--kind", "ring", "--stages", "4", "--microbatches", "8"], "kind='ring'"),
    (["--kind", "1f1b", "--stages", "0", "--microbatches", "8"], "--stages"),
    (["--kind", "1f1b", "--stages", "4", "--microbatches", "-2"], "--microbatches"),
    (["--kind", "interleaved-1f1b", "--stages", "4", "--microbatches", "6"], "microbatches=6"),
    (["--kind", "dualpipev", "--stages", "4", "--microbatches", "6"], "microbatches=6"),
    (["--kind", "zb-v", "--stages", "4", "--microbatches", "8", "--virtual", "3"], "virtual=3"),
    (["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--t-w", "-1"], "--t-w"),
    (["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--stage-scale", "1,x"],
     "stage-scale"),
    (["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--stage-scale", "1,2"],
     "stage_scale"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--png", "/nonexistent/x.png"],
     "png"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--png", "x.jpg"], "png"),
    (["--kind", "all", "--stages", "2", "--microbatches", "2", "--trace", "t.json"], "kind"),
    (["--stages", "2", "--microbatches", "2"], "--kind"),
])
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch, argv: list[str],
                               words: str) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        code, out, err = run(capsys, "schedule", *argv)
    except SystemExit as e:  # argparse's own errors
        code, (out, err) = int(e.code or 0), capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_no_traceback_in_a_real_process() -> None:
    r = subprocess.run([sys.executable, "-m", "shardlab", "schedule", "--kind", "zb-h2",
                        "--stages", "4", "--microbatches", "8", "--t-fwd", "-3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
