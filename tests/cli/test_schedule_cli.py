"""``shardlab schedule`` from the command line: JSON fields, the action list on request or in a
file, pictures, --kind all, bad input."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import pytest

from shardlab.cli import main
from shardlab.cli import schedule as schedule_cli
from shardlab.cli.output import Vouched, print_json


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("schedule", "--kind", "1f1b", "--stages", "4", "--microbatches", "8",
            "--activation-bytes", "1e9", "--json")
    code, out, _ = run(capsys, *argv)
    doc = json.loads(out)
    assert code == 0 and "timeline" not in doc  # the summary, unless --actions asks
    assert doc["makespan"] == 33 and doc["bubble"] == pytest.approx(3 / 11)
    assert doc["peak_inflight"] == [4, 3, 2, 1]
    assert doc["peak_activation_bytes"] == [4e9, 3e9, 2e9, 1e9]
    assert len(doc["bubble_per_rank"]) == 4 and doc["closed_form"]["bubble"] == 3 / 11
    assert doc["actions"] == 64 and doc["messages"] == 48
    code, out, _ = run(capsys, *argv, "--actions")
    assert code == 0 and out.count("\n") == 1  # one line: json's C encoder, no indentation
    full = json.loads(out)
    assert {k: v for k, v in full.items() if k != "timeline"} == doc
    first = full["timeline"][0][0]
    assert set(first) >= {"start", "end", "kind", "microbatch", "chunk"}
    assert (first["start"], first["kind"], first["microbatch"], first["chunk"]) == (0, "F", 0, 0)
    assert sum(len(r) for r in full["timeline"]) == 4 * 8 * 2



def test_one_line_json_is_the_same_document(capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"x": [1.5, math.inf, (2, -math.nan)], 3: {"y": None}, "v": Vouched([{"a": 0.5}])}
    print_json(doc)
    indented = capsys.readouterr().out
    print_json(doc, compact=True)
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and indented.count("\n") > 5
    assert json.loads(line) == json.loads(indented) == {
        "x": [1.5, None, [2, None]], "3": {"y": None}, "v": [{"a": 0.5}]}

def test_actions_out_writes_json_lines_or_a_chrome_trace(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    argv = ("schedule", "--kind", "zb-v", "--stages", "2", "--microbatches", "4", "--p2p", "0.1")
    timeline = json.loads(run(capsys, *argv, "--json", "--actions")[1])["timeline"]
    lines, trace = tmp_path / "a.jsonl", tmp_path / "a.JSON"  # the suffix in any case
    code, out, err = run(capsys, *argv, "--actions-out", str(lines))
    assert code == 0 and err == "" and "bubble" in out  # the terminal view as ever
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [{k: v for k, v in row.items() if k != "rank"} for row in rows] == [
        e for rank in timeline for e in rank]
    assert [row["rank"] for row in rows] == [r for r, rank in enumerate(timeline) for _ in rank]
    code, out, _ = run(capsys, *argv, "--json", "--actions-out", str(trace))
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert code == 0 and "timeline" not in json.loads(out)
    assert [(e["tid"], e["ts"], e["name"]) for e in slices] == [
        (r, a["start"] * 1e6, f"{a['kind']}{a['microbatch']}")
        for r, rank in enumerate(timeline) for a in rank]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.JSON", "a.jsonl"]


def test_a_write_that_fails_midway_leaves_nothing(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(t: object, suffix: str, f: IO[bytes]) -> None:
        f.write(b'{"rank":0')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(schedule_cli, "write_actions", disk_full)
    target = tmp_path / "a.jsonl"
    code, out, err = run(capsys, "schedule", "--kind", "1f1b", "--stages", "2",
                         "--microbatches", "2", "--actions-out", str(target))
    assert code == 2 and out == ""
    assert err == (f"shardlab schedule: error: actions-out='{target}': cannot be written "
                   "(No space left on device)\n")
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary


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


def test_uneven_stages_take_their_layers_time(capsys: pytest.CaptureFixture[str]) -> None:
    # 3 + 1 layers at one unit a layer (tests/schedules/test_simulate.py has the timeline):
    # 1F1B 36 and GPipe 39, against 30 for the even split at the same total work.
    base = ("schedule", "--stages", "2", "--microbatches", "4", "--json")
    code, out, _ = run(capsys, *base, "--kind", "1f1b", "--stage-layers", "3,1")
    doc = json.loads(out)
    assert code == 0 and doc["makespan"] == 36 and doc["bubble"] == pytest.approx(1 / 3)
    assert doc["stage_layers"] == [3, 1] and doc["stage_backward"] == [6, 2]
    assert doc["closed_form"] == {}  # 1F1B: no closed form for unequal stages
    code, out, _ = run(capsys, *base, "--kind", "gpipe", "--stage-layers", "3+1")
    doc = json.loads(out)
    assert doc["makespan"] == doc["closed_form"]["makespan"] == 39
    code, out, _ = run(capsys, *base, "--kind", "1f1b", "--stage-layers", "2,2")
    assert json.loads(out)["makespan"] == 30


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
     "stage-scale='1,2': gives 2 factors; 1f1b on 4 stages x 1 chunk(s) per rank has 4"),
    (["--kind", "zb-v", "--stages", "2", "--microbatches", "4", "--stage-scale", "1,1"],
     "stage-scale='1,1': gives 2 factors; zb-v on 2 stages x 2 chunk(s) per rank has 4"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--stage-scale", "1,0"],
     "stage-scale='1,0': every factor must be a number in (0, 1e+06]"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--stage-scale", "1e300,1"],
     "stage-scale='1e300,1': every factor must be a number in (0, 1e+06]"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--stage-layers", "3,0"],
     "stage_layers='3,0': every stage needs at least one layer"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--stage-layers", "3,x"],
     "stage_layers='3,x': must be whole layer counts"),
    (["--kind", "zb-v", "--stages", "2", "--microbatches", "4", "--stage-layers", "3+1"],
     "stage_layers='3,1': gives 2 counts; zb-v on 2 stages x 2 chunk(s) per rank has 4"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--t-bwd", "1e308", "--t-w",
      "1e308"], "t-bwd=1e+308: must be <= 1e+15"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--width", "1e9"],
     "width=1000000000: must be <= 2000"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--activation-bytes", "1e300"],
     "activation-bytes=1e+300: must be <= 1e+18"),
    (["--kind", "1f1b", "--stages", "1000", "--microbatches", "1000"],
     "stages=1000: must be <= 256"),
    (["--kind", "gpipe", "--stages", "1", "--microbatches", "5000"],
     "microbatches=5000: must be <= 4096"),
    (["--kind", "interleaved-1f1b", "--stages", "2", "--microbatches", "2", "--virtual",
      "140000"], "virtual=140000: interleaved-1f1b on 2 stages x 140000 chunk(s) x 2 "
     "micro-batches x 2 would run 1,120,000 actions; at most 262,144"),
    (["--kind", "zb-h2", "--stages", "256", "--microbatches", "400"],
     "microbatches=400: zb-h2 on 256 stages x 1 chunk(s) x 400 micro-batches x 3 would run "
     "307,200 actions; at most 262,144 (fewer micro-batches: at most 341)"),
    (["--kind", "all", "--stages", "256", "--microbatches", "600"], "microbatches=600: gpipe"),
    (["--kind", "1f1b", "--stages", "100", "--microbatches", "101", "--svg", "s.svg"],
     "svg='s.svg': draws at most 20,000 actions; this schedule has 20,200"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--png", "s.png", "--trace",
      "s.png"], "trace='s.png': is also --png's file"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--png", "/nonexistent/x.png"],
     "png"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--png", "x.jpg"], "png"),
    (["--kind", "all", "--stages", "2", "--microbatches", "2", "--trace", "t.json"], "kind"),
    (["--kind", "all", "--stages", "2", "--microbatches", "2", "--actions-out", "a.jsonl"],
     "kind='all': draws no pictures and lists no actions"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--actions"],
     "actions=True: only with --json"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--actions-out", "a.txt"],
     "actions-out='a.txt': must end in .jsonl (JSON lines, one action a line) or .json "
     "(a Chrome trace)"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--actions-out",
      "/nonexistent/a.jsonl"], "actions-out='/nonexistent/a.jsonl': its folder"),
    (["--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--trace", "a.json",
      "--actions-out", "a.json"], "actions-out='a.json': is also --trace's file"),
    (["--stages", "2", "--microbatches", "2"], "--kind"),
    # Once ran: one stage has nothing to interleave (make_layout refuses it too).
    (["--kind", "interleaved-1f1b", "--stages", "1", "--microbatches", "4"],
     "stages=1: must be >= 2 for interleaved-1f1b"),
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


SUFFIX = {"png": "png", "svg": "svg", "trace": "json", "actions-out": "jsonl"}
"""Each file flag and a suffix it accepts."""


@pytest.mark.parametrize("flag", list(SUFFIX))
def test_a_folder_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                             flag: str) -> None:
    folder = tmp_path / f"pictures.{SUFFIX[flag]}"
    folder.mkdir()
    code, out, err = run(capsys, "schedule", "--kind", "1f1b", "--stages", "2",
                         "--microbatches", "2", f"--{flag}", str(folder))
    assert code == 2 and out == ""
    assert err == (f"shardlab schedule: error: {flag}='{folder}': must be a file path, not a "
                   "folder\n")
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("flag", list(SUFFIX))
def test_a_read_only_place_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, flag: str) -> None:
    # A read-only file system refuses every new file, root's too: os.access cannot see it
    # for root, so the check must try. Stood in for by mkstemp failing as it does there.
    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    target = tmp_path / f"s.{SUFFIX[flag]}"
    code, out, err = run(capsys, "schedule", "--kind", "1f1b", "--stages", "2",
                         "--microbatches", "2", f"--{flag}", str(target))
    assert code == 2 and out == ""
    assert err == (f"shardlab schedule: error: {flag}='{target}': cannot be written "
                   "(Read-only file system)\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["022", "027"])
def test_files_get_the_mode_the_umask_gives(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path, umask: int) -> None:
    files = {f: tmp_path / f"s.{suffix}" for f, suffix in SUFFIX.items()}
    old = os.umask(umask)
    try:
        code, _, err = run(capsys, "schedule", "--kind", "1f1b", "--stages", "2",
                           "--microbatches", "2",
                           *(a for f, p in files.items() for a in (f"--{f}", str(p))))
    finally:
        os.umask(old)
    assert code == 0 and err == ""
    assert {f: stat.S_IMODE(p.stat().st_mode) for f, p in files.items()} == dict.fromkeys(
        files, 0o666 & ~umask)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "s.jsonl", "s.png", "s.svg"]
