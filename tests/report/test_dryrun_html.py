"""The dry-run page: from a real `shardlab dryrun --json` document (a 4-rank tp=2 pp=2 job,
--all-roles, --gpu h100, saved in data/), every role's bars and tables and the verdict; a
file that is not such a document, or an output that cannot be written, is one line and
exit code 2 with nothing written. No torch, no real dry run."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from shardlab.cli import build_parser, main
from shardlab.cli import dryrun as dryrun_cli
from shardlab.errors import SpecError
from shardlab.report.dryrun_html import (
    check_document,
    dryrun_sections,
    dryrun_title,
    load_dryrun,
    memory_bars,
)
from shardlab.report.html import page

SAMPLE = Path(__file__).parent / "data" / "dryrun-tp2-pp2.json"


@pytest.fixture(scope="module")
def sample() -> dict[str, Any]:
    return load_dryrun(str(SAMPLE))


def html_of(doc: dict[str, Any]) -> str:
    title, subtitle = dryrun_title(doc)
    return page(title, subtitle, dryrun_sections(doc))


def test_the_bars_are_the_predicted_and_the_peaks_breakdown(sample: dict[str, Any]) -> None:
    labels, parts = memory_bars(sample)
    assert labels == ["rank 2 predicted", "rank 2 dry run", "rank 0 predicted",
                      "rank 0 dry run"]
    assert list(parts) == ["weights", "gradients", "optimizer", "activations", "temporaries"]
    totals = [sum(v[i] for v in parts.values()) for i in range(len(labels))]
    for k, role in enumerate(sample["roles"]):
        assert totals[2 * k] == role["predicted"]["peak_bytes"]
        assert totals[2 * k + 1] == role["peak_bytes"]  # by_category sums to the peak
        assert parts["gradients"][2 * k + 1] == role["by_category"]["grads"]


def test_the_page_shows_every_role_and_the_verdict(sample: dict[str, Any]) -> None:
    sections = dryrun_sections(sample, prefix="d")
    assert [s.id for s in sections] == ["d-overview", "d-memory", "d-roles", "d-unseen"]
    [chart] = [c for s in sections for c in s.charts]
    assert chart.name == "d-memory"
    for label in ("rank 2 predicted", "rank 2 dry run", "rank 0 predicted", "rank 0 dry run",
                  "temporaries"):
        assert label in chart.svg
    # 80 GB against a 1.8 MB peak: the lines would squash the bars, the caption says so.
    assert "capacity" not in chart.svg
    assert "is off this scale: the largest bar is 0.0022% of it" in chart.caption
    html = html_of(sample)
    assert "<title>Dry run: llama L=4 d=64" in html and "on 4 ranks" in html
    assert "dry-ran ranks 0, 2 on fake tensors in 5.94 s" in html
    assert '<span class="ok">fits</span>: peak 1.79 MB + CUDA context 1.41 GB' in html
    assert "fit on h100" in html
    for role in ("Rank 2 (pipeline rank 1, stage 1, 2 layers): the busiest",
                 "Rank 0 (pipeline rank 0, stage 0, 2 layers)"):
        assert role in html
    assert "inside StageModule.blocks.1.mlp" in html
    assert "<td>activations saved</td><td class=\"n\">340.99 KB</td><td class=\"n\">531.84 " \
           "KB</td><td class=\"n\">1.560</td><td class=\"n\">-</td>" in html
    assert "<td>tp</td><td class=\"n\">169,984</td><td class=\"n\">251,904</td>" in html
    for unseen in sample["unseen"]:
        assert f"<li>{unseen}</li>" in html


def test_a_tight_device_draws_both_lines_and_says_it_does_not_fit(
        sample: dict[str, Any]) -> None:
    doc = copy.deepcopy(sample)
    need = doc["peak_bytes"] + 3e5
    doc["fit"].update(capacity_bytes=1.9e6, allowance_bytes=3e5, needed_bytes=need,
                      headroom_bytes=1.9e6 - need, fits=False)
    [chart] = [c for s in dryrun_sections(doc) for c in s.charts]
    assert "capacity less the CUDA context" in chart.svg and "capacity" in chart.svg
    assert "the dotted one that less the CUDA context's allowance (1.60 MB)" in chart.caption
    assert '<span class="bad">does NOT fit</span>' in html_of(doc)


def test_without_a_device_no_verdict(sample: dict[str, Any]) -> None:
    doc = copy.deepcopy(sample)
    del doc["fit"]
    doc["gpu"] = None
    doc["model"] = '<script>alert("x")</script>'
    html = html_of(doc)
    assert "no device given" in html and "off this scale" not in html
    assert "<script>" not in html and "&lt;script&gt;" in html


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("roles"), "roles is missing"),
    (lambda d: d.update(roles=[]), "roles is not a list of roles"),
    (lambda d: d["roles"][1]["by_category"].pop("params"),
     r"roles\[1\]\.by_category\.params is missing"),
    (lambda d: d["roles"][0]["predicted"].update(peak_bytes="1 GB"),
     r"roles\[0\]\.predicted\.peak_bytes is not a number"),
    (lambda d: d["roles"][0]["by_dim"].update(tp=3), r"roles\[0\]\.by_dim\.tp is not an object"),
    (lambda d: d["fit"].update(fits="yes"), "fit.fits is not true or false"),
    (lambda d: d.update(gpus=True), "gpus is not an integer"),
])
def test_what_is_not_a_dryrun_document_is_named(sample: dict[str, Any], change: Any,
                                                message: str) -> None:
    doc = copy.deepcopy(sample)
    change(doc)
    with pytest.raises(SpecError, match=message):
        check_document(doc, "f.json")


def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["report", "dryrun", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_dryrun_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.html"
    code, stdout, _ = run("--from", str(SAMPLE), "-o", str(out), "--figures",
                          str(tmp_path / "figs"), capsys=capsys)
    assert code == 0
    assert stdout.startswith(f"wrote {out} (") and "1 charts); 2 figure files" in stdout
    assert out.read_text().count('data-chart="dryrun-memory"') == 1
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["dryrun-memory.png",
                                                                     "dryrun-memory.svg"]


def test_report_dryrun_from_standard_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(SAMPLE.read_bytes())))
    monkeypatch.chdir(tmp_path)
    assert run("--from", "-", capsys=capsys)[0] == 0
    assert "Rank 0 (pipeline rank 0" in (tmp_path / "dryrun-report.html").read_text()


@pytest.mark.parametrize(("name", "data", "message"), [
    (None, None, "no such file"),
    ("folder", None, "it is a folder"),
    ("d.json", b"{not json", r"it is not JSON \(Expecting property name"),
    ("d.pkl", b"\x80\x04\x95\x10\x00\x00\x00", r"it is not UTF-8 text \(byte 0 is 0x80\)"),
    ("d.json", b"[1, 2]", "the document is not an object"),
    ("d.json", b'{"model": "m"}', "layout is missing"),
    ("d.json", b"[" * 100_000, "it is not JSON that can be read"),
    ("fifo", None, "it is not a regular file"),
], ids=["missing", "folder", "not-json", "pickle", "array", "train-report", "deep", "fifo"])
def test_bad_input_is_one_line_and_nothing_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str | None,
        data: bytes | None, message: str) -> None:
    src = tmp_path / (name or "nothing.json")
    if name == "folder":
        src.mkdir()
    elif name == "fifo":
        os.mkfifo(src)  # reading it would wait for ever
    elif data is not None:
        src.write_bytes(data)
    out = tmp_path / "out" / "d.html"
    out.parent.mkdir()
    code, stdout, err = run("--from", str(src), "-o", str(out), capsys=capsys)
    assert (code, stdout) == (2, "")
    assert err.count("\n") == 1 and err.startswith("shardlab report: error: from=")
    assert re.search(message, err)
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--from", str(SAMPLE), "-o", "/no/such/d.html"], "output='/no/such/d.html': its folder"),
    (["--from", str(SAMPLE), "--gpus", "4"], "gpus=4: cannot be combined with --from"),
    (["--from", str(SAMPLE), "llama-3-8b"], "model='llama-3-8b': cannot be combined"),
    (["--from", str(SAMPLE), "--dtype", "fp32"], "dtype='fp32': cannot be combined"),
    (["--from", str(SAMPLE), "--layers", "8"], "layers=8: cannot be combined"),
    (["--layout", "tp=2"], "gpus=None: is required"),
    (["--from", str(SAMPLE), "--json"], "json=True: the report writes HTML"),
    (["--from", "x" * 10_000], "cannot be read (File name too long)"),
])
def test_bad_command_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str], argv: list[str],
                           message: str) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, err = run(*argv, capsys=capsys)
    assert (code, stdout) == (2, "")
    assert err.count("\n") == 1 and message in err
    assert list(tmp_path.iterdir()) == []


def test_the_live_form_takes_dryruns_flags_and_draws_its_document(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[Any] = []

    def fake(args: Any) -> dict[str, Any]:  # `shardlab dryrun`'s document, without a run
        seen.append(args)
        return json.loads(SAMPLE.read_text())

    monkeypatch.setattr(dryrun_cli, "dryrun_document", fake)
    out = tmp_path / "live.html"
    code, stdout, _ = run("--gpus", "4", "--layout", "tp=2 pp=2", "--all-roles", "--gpu",
                          "h100", "-o", str(out), capsys=capsys)
    assert code == 0 and stdout.startswith(f"wrote {out}")
    [args] = seen
    assert (args.gpus, args.layout, args.all_roles, args.gpu) == (4, "tp=2 pp=2", True,
                                                                  "h100")
    assert "Rank 2 (pipeline rank 1, stage 1, 2 layers): the busiest" in out.read_text()


def test_the_live_form_checks_the_output_first_and_passes_a_failure_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from shardlab.dryrun.pool import RoleError

    calls: list[Any] = []

    def failing(args: Any) -> dict[str, Any]:
        calls.append(args)
        raise RoleError("rank 0: RuntimeError: boom")

    monkeypatch.setattr(dryrun_cli, "dryrun_document", failing)
    assert run("--gpus", "4", "-o", "/no/such/d.html", capsys=capsys)[0] == 2
    assert calls == []  # refused before a dry run of minutes
    monkeypatch.chdir(tmp_path)
    assert run("--gpus", "4", capsys=capsys)[0] == 1  # a role failed: dryrun said which
    assert len(calls) == 1 and list(tmp_path.iterdir()) == []


def test_the_kind_has_every_flag_of_dryrun() -> None:
    parser = build_parser()
    argv = ["llama-3-8b", "--gpus", "64", "--layout", "tp=8", "--seq", "8192",
            "--global-batch", "64", "--dtype", "fp32", "--rank", "3", "--gpu", "h100",
            "--jobs", "2"]
    live = vars(parser.parse_args(["dryrun", *argv]))
    report = vars(parser.parse_args(["report", "dryrun", *argv]))
    assert {k: v for k, v in report.items() if k in live and k not in {"command", "run"}} \
        == {k: v for k, v in live.items() if k not in {"command", "run"}}
    assert report["from_file"] is None and report["output"] == "dryrun-report.html"
