"""``shardlab simulate`` from the command line: JSON fields, exit codes, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shardlab.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "--dp", "2", "--tp", "2", "--pp", "2", "--zero", "1",
                       "--steps", "2", "--dtype", "float64", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["devices"] == 8
    assert doc["max_param_diff"] <= 1e-12 and doc["max_loss_diff"] <= 1e-12
    for kind in ("dp", "tp", "pp"):
        c = doc["comm"][kind]
        assert len(c["counted_bytes"]) == 8 and c["counted_bytes"] == c["predicted_bytes"]
        assert all(x > 0 for x in c["counted_bytes"])
    s = doc["state_bytes"][0]
    assert s["counted"] == {k: int(v) for k, v in s["predicted"].items()}


def test_human_view_and_gpt_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "--style", "gpt", "--dp", "2", "--pp", "2",
                       "--schedule", "gpipe", "--steps", "1")
    assert code == 0
    for words in ("Checks", "counted vs cost model", "all checks pass", "embedding"):
        assert words in out


def test_exit_1_when_a_check_fails(capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import shardlab.sim.run as sim_run

    monkeypatch.setattr(sim_run, "TOLERANCE", {k: -1.0 for k in sim_run.TOLERANCE})
    code, out, _ = run(capsys, "simulate", "--dp", "2", "--steps", "1", "--json")
    assert code == 1 and json.loads(out)["passed"] is False


@pytest.mark.parametrize(("argv", "words"), [
    (["--tp", "3"], "tp=3"),
    (["--pp", "5"], "pp=5"),
    (["--dp", "2", "--microbatches", "2", "--global-batch", "6"], "global_batch=6"),
    (["--zero", "4"], "zero=4"),
    (["--sp"], "sp=True"),
    (["--vocab", "10"], "vocab=10"),
    (["--kv-heads", "3"], "kv_heads=3"),
    (["--dtype", "float16"], "--dtype"),
    (["--schedule", "zb-v"], "--schedule"),
    (["nonexistent-model-x"], "model="),
])
def test_bad_input_is_one_line_before_work(capsys: pytest.CaptureFixture[str], argv: list[str],
                                           words: str) -> None:
    code, out, err = run(capsys, "simulate", *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_no_traceback_in_a_real_process() -> None:
    r = subprocess.run([sys.executable, "-m", "shardlab", "simulate", "--tp", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
