"""``shardlab.calibrate.cpu`` and ``shardlab hardware --measure``: this CPU as an accelerator."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.cli.budget_cli_support import run_cli

from shardlab.calibrate.cpu import BUDGET_SHARES, LINEAR_SHAPES, measure_cpu
from shardlab.calibrate.runtime import SIZES
from shardlab.calibrate.store import save_measurement
from shardlab.config.hardware import ACCELERATORS, Accelerator
from shardlab.config.measured import (
    LOOPBACK_LATENCY,
    NAME,
    PROBE,
    accelerator_or_measured,
    load_measurement,
    measurement_path,
)
from shardlab.config.runtime import parse_runtime
from shardlab.errors import SpecError

pytest.importorskip("torch")

FAST = {"seconds": 0.2, "matmul_n": 128, "copy_bytes": 4 * 2**20}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private SHARDLAB_HOME, so no test touches ~/.cache/shardlab."""
    monkeypatch.setenv("SHARDLAB_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    return measure_cpu(threads=1, **FAST)


def test_measure_gives_positive_finite_figures(measured: dict[str, Any]) -> None:
    assert measured["name"] == NAME
    assert set(measured["peak_flops"]) == {"fp32", "bf16"}
    for key in ("fp32", "bf16"):
        x = measured["peak_flops"][key]
        assert math.isfinite(x) and x > 0, key
    for key in ("memory_bytes", "memory_bandwidth", "copy_bandwidth"):
        assert math.isfinite(measured[key]) and measured[key] > 0, key
    assert measured["copy_bandwidth"] == pytest.approx(measured["memory_bandwidth"] / 2)
    assert measured["power_watts"] == 0  # unknown, stated
    assert measured["threads"] == 1
    assert measured["torch"] and measured["date"] and measured["method"]
    # Plausible orders of magnitude for any CPU that runs this suite.
    assert 1e8 < measured["peak_flops"]["fp32"] < 1e15
    assert 1e8 < measured["memory_bandwidth"] < 1e13
    json.dumps(measured)  # JSON-ready


def test_measure_records_no_host_name(measured: dict[str, Any]) -> None:
    import socket

    host = socket.gethostname()
    if len(host) >= 6:
        assert host not in json.dumps(measured)


def test_measure_restores_torch_threads() -> None:
    import torch

    before = torch.get_num_threads()
    measure_cpu(threads=1, seconds=0.04, matmul_n=32, copy_bytes=2**16)
    assert torch.get_num_threads() == before


def test_measure_refuses_bad_budget() -> None:
    with pytest.raises(SpecError, match="seconds"):
        measure_cpu(seconds=0)


def test_default_path_follows_shardlab_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert measurement_path() == home / "cpu.json"
    monkeypatch.delenv("SHARDLAB_HOME")
    assert measurement_path() == Path.home() / ".cache" / "shardlab" / "cpu.json"


def test_save_load_round_trip(home: Path, measured: dict[str, Any]) -> None:
    assert load_measurement() is None  # nothing stored yet
    path = save_measurement(measured)
    assert path == home / "cpu.json" and path.is_file()
    assert [p.name for p in home.iterdir()] == ["cpu.json"]  # no temporary file left behind
    acc = load_measurement()
    assert isinstance(acc, Accelerator)
    assert acc.name == NAME
    assert acc.peak("fp32") == measured["peak_flops"]["fp32"]
    assert acc.peak("bf16") == measured["peak_flops"]["bf16"]
    assert acc.memory_bytes == measured["memory_bytes"]
    assert acc.memory_bandwidth == measured["memory_bandwidth"]
    assert acc.power_watts == 0
    assert acc.gpus_per_node == 1
    assert acc.intra_link == acc.inter_link
    assert acc.intra_link.bandwidth == measured["copy_bandwidth"]
    assert acc.intra_link.latency == LOOPBACK_LATENCY
    assert str(path) in acc.source


def test_accelerator_or_measured(home: Path, measured: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match="shardlab hardware --measure"):
        accelerator_or_measured("cpu")
    save_measurement(measured)
    for name in ("cpu", "CPU", "cpu (measured)", " Cpu (Measured) "):
        assert accelerator_or_measured(name).name == NAME
    assert accelerator_or_measured("h100") is ACCELERATORS["H100 SXM"]


def test_energy_with_unknown_power_is_zero(home: Path, measured: dict[str, Any]) -> None:
    from shardlab.estimate.timing import train_time

    save_measurement(measured)
    acc = accelerator_or_measured("cpu")
    t = train_time(1e15, 1, acc.peak("bf16"), 0.5, 0.0, acc.power_watts)
    assert t.energy_kwh == 0 and t.seconds > 0


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "one JSON object"),
    ('{"schema": "other"}', "schema"),
    ("PEAK_MISSING", "peak_flops lacks bf16"),
    ("PEAK_NEGATIVE", "peak_flops.fp32"),
    ("BANDWIDTH_NAN", "memory_bandwidth"),
    ("THREADS_BAD", "threads"),
], ids=["not-json", "not-object", "schema", "missing-bf16", "negative-peak", "nan-bandwidth",
        "bad-threads"])
def test_corrupt_file_is_spec_error_naming_it(tmp_path: Path, measured: dict[str, Any],
                                              text: str, needle: str) -> None:
    doc = json.loads(json.dumps(measured))
    if text == "PEAK_MISSING":
        del doc["peak_flops"]["bf16"]
    elif text == "PEAK_NEGATIVE":
        doc["peak_flops"]["fp32"] = -1.0
    elif text == "BANDWIDTH_NAN":
        doc["memory_bandwidth"] = float("nan")
    elif text == "THREADS_BAD":
        doc["threads"] = 0
    if text.isupper():
        text = json.dumps(doc)
    path = tmp_path / "cpu.json"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_measurement(path)
    message = str(info.value)
    assert str(path) in message and needle in message, message
    assert "shardlab hardware --measure" in message


@pytest.mark.multiprocess
def test_cli_measure_json_then_listed(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    code, out, err = run_cli(capsys, "hardware", "--measure", "--seconds", "0.2", "--json")
    assert code == 0, err
    doc = json.loads(out)  # one JSON document and nothing else
    assert doc["name"] == NAME
    # Progress goes to stderr: one line per phase, each phase with its budget recorded.
    names = [p["name"] for p in doc["phases"]]
    assert names == [*BUDGET_SHARES, "runtime"]
    assert [line.split()[0] for line in err.splitlines()] == [n.split()[0] for n in names]
    # The 2-rank part: gloo's fits and the runtime's fixed costs, usable by the planner.
    rt = parse_runtime(doc["runtime"])
    assert rt is not None and rt.world == 2
    for name, (latency, bandwidth) in rt.collectives.items():
        assert 0 <= latency < 0.1 and 1e6 < bandwidth < 1e12, name
        samples = doc["runtime"]["collectives"][name]["samples"]
        assert [n for n, _ in samples] == list(SIZES) and all(t > 0 for _, t in samples)
    for style, o in rt.overheads.items():
        points = doc["runtime"]["overheads"][style]["points"]
        assert len(points) == 4 and all(p["seconds"] > 0 for p in points), style
        assert o.seconds(2, 2) > 0
    # DTensor dispatch on every operator costs more than plain eager (DDP) does.
    assert rt.overheads["tp"].seconds(2, 2) > rt.overheads["ddp"].seconds(2, 2)
    assert load_measurement().runtime == rt
    assert doc["peak_flops"]["fp32"] > 0 and doc["peak_flops"]["bf16"] > 0
    assert doc["memory_bandwidth"] > 0
    assert doc["path"] == str(home / "cpu.json")
    assert (home / "cpu.json").is_file()
    stored = json.loads((home / "cpu.json").read_text())
    assert stored["peak_flops"] == doc["peak_flops"]

    code, out, err = run_cli(capsys, "hardware", "--json")
    assert code == 0, err
    accels = {a["name"]: a for a in json.loads(out)["accelerators"]}
    assert "H100 SXM" in accels
    assert accels[NAME]["peak_flops"] == doc["peak_flops"]
    assert accels[NAME]["power_watts"] == 0

    code, out, err = run_cli(capsys, "hardware")
    assert code == 0, err
    assert "cpu" in out and "loopback" in out


def test_cli_measure_human_view(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    code, out, err = run_cli(capsys, "hardware", "--measure", "--seconds", "0.2",
                             "--threads", "1", "--no-runtime")
    assert code == 0, err
    assert "TFLOP/s" in out and "GB/s" in out and "cpu.json" in out
    assert "gloo" not in out  # the 2-rank part was left out
    assert "runtime" not in json.loads((home / "cpu.json").read_text())
    assert load_measurement().runtime is None


def test_cli_hardware_without_measurement_has_no_cpu_row(capsys: pytest.CaptureFixture[str],
                                                         home: Path) -> None:
    code, out, err = run_cli(capsys, "hardware", "--json")
    assert code == 0, err
    assert NAME not in {a["name"] for a in json.loads(out)["accelerators"]}


@pytest.mark.parametrize("argv", [["--seconds", "1"], ["--threads", "1"], ["--no-runtime"],
                                  ["--measure", "--seconds", "0"],
                                  ["--measure", "--hardware-file", "x.toml"]],
                         ids=["seconds-alone", "threads-alone", "no-runtime-alone",
                              "zero-seconds", "with-file"])
def test_cli_bad_measure_flags_are_one_line(capsys: pytest.CaptureFixture[str], home: Path,
                                            argv: list[str]) -> None:
    code, out, err = run_cli(capsys, "hardware", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not (home / "cpu.json").exists()


def test_cli_corrupt_stored_file_is_one_line(capsys: pytest.CaptureFixture[str],
                                             home: Path) -> None:
    home.mkdir()
    (home / "cpu.json").write_text("{oops")
    code, out, err = run_cli(capsys, "hardware", "--json")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(home / "cpu.json") in err, err


def test_import_does_not_pull_in_torch() -> None:
    code = ("import sys, shardlab.config.measured, shardlab.config.runtime, "
            "shardlab.cli.catalogs; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, "reading a stored measurement pulled in torch" + r.stderr


def test_measure_records_one_thread_figures(measured: dict[str, Any]) -> None:
    single = measured["single_thread"]
    assert single["peak_fp32"] > 0 and single["matmul_n"] == FAST["matmul_n"] // 2
    # The shapes in order; with a tiny budget the sweep may stop early, after two at least.
    shapes = [(r["t"], r["k"], r["n"]) for r in single["linear_sweep_fp32"]]
    assert len(shapes) >= 2 and shapes == list(LINEAR_SHAPES[:len(shapes)])
    assert all(r["flops_per_s"] > 0 for r in single["linear_sweep_fp32"])
    assert measured["op_seconds_autograd"] > 0 and single["layer_seconds"] > 0
    probe = single["layer_probe"]
    assert {k: probe[k] for k in PROBE} == PROBE and probe["seconds"] > 0


def test_layer_probe_is_loaded_or_ignored(home: Path, measured: dict[str, Any]) -> None:
    save_measurement(measured)
    acc = load_measurement()
    assert acc is not None and acc.layer_probe == {
        k: float(v) for k, v in measured["single_thread"]["layer_probe"].items()}
    for bad in (-1.0, "x", None, True):
        doc = json.loads(json.dumps(measured))
        doc["single_thread"]["layer_probe"]["seconds"] = bad
        save_measurement(doc)
        assert load_measurement().layer_probe is None, bad


def test_one_thread_curve_is_the_least_squares_fit(home: Path, measured: dict[str, Any]) -> None:
    # Points exactly on 0.6 x I/(I + 50) of a 1e11 peak: the fit gives the curve back.
    doc = json.loads(json.dumps(measured))
    rows = []
    for t, k, n in LINEAR_SHAPES:
        i = 1 / (1 / t + 1 / k + 1 / n)
        rows.append({"t": t, "k": k, "n": n, "flops_per_s": 1e11 * 0.6 * i / (i + 50)})
    doc["single_thread"] = {"peak_fp32": 1e11, "matmul_n": 1024, "linear_sweep_fp32": rows,
                            "layer_seconds": 3.6e-3}
    save_measurement(doc)
    acc = load_measurement()
    assert acc is not None and acc.single_thread is not None
    peak, eff = acc.single_thread
    assert peak == 1e11
    assert eff.peak_fraction == pytest.approx(0.6) and eff.half_intensity == pytest.approx(50)
    # The tiny layer's fixed cost shared out over the 3 x 12 operators a layer is charged.
    assert eff.op_overhead == pytest.approx(max(doc["op_seconds_autograd"], 3.6e-3 / 36))
    # An older file without the one-thread figures still loads, without them.
    del doc["single_thread"]
    save_measurement(doc)
    assert load_measurement().single_thread is None


def test_small_matmuls_at_peak_give_a_flat_curve(home: Path, measured: dict[str, Any]) -> None:
    doc = json.loads(json.dumps(measured))
    peak = doc["peak_flops"]["fp32"]
    doc["matmul_sweep_fp32"] = {"64": peak * 1.2, "128": peak, "256": peak * 1.1}
    save_measurement(doc)
    eff = load_measurement().efficiency
    assert eff.half_intensity == 0 and eff.peak_fraction == pytest.approx(1.0)


def test_plan_uses_one_thread_figures_when_each_process_has_one_core(
        home: Path, measured: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from shardlab.config.dtypes import get_policy
    from shardlab.plan import search
    from shardlab.plan.efficiency import efficiency_of

    # The one-thread sweep as a straight line in 1/intensity (what the fit expects), not as
    # measured: on a loaded machine a short sweep can come out without a usable fit.
    single = dict(measured["single_thread"] or {})
    peak = float(single.get("peak_fp32") or 1e10)
    single["peak_fp32"] = peak
    single["linear_sweep_fp32"] = [
        {"t": t, "k": 512, "n": 512, "flops_per_s": peak * 0.8 * i / (i + 40)}
        for t in (64, 256, 1024) for i in [1 / (1 / t + 2 / 512)]]
    save_measurement({**measured, "single_thread": single})
    acc = load_measurement()
    assert acc.single_thread is not None
    monkeypatch.setattr(search.os, "cpu_count", lambda: 2)
    fp32 = get_policy("fp32")
    two, _ = search.device_of(acc, fp32, 2)
    assert two.peak == min(acc.single_thread[0], acc.peak("fp32") / 2)
    assert two.eff == acc.single_thread[1]
    assert two.memory_bandwidth == acc.memory_bandwidth / 2
    one, _ = search.device_of(acc, fp32, 1)  # one process with both cores: the pool's figures
    # The pool's curve as the planner takes it: the measured fit, or the stated CPU default
    # when a loaded machine's sweep gave none (acc.efficiency None).
    assert one.peak == acc.peak("fp32") and one.eff == efficiency_of(acc)
