"""``shardlab models`` and ``shardlab hardware`` on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.cli.budget_cli_support import assert_one_line_error, run_cli

from shardlab.config.catalog import MODELS

DENSE_BF16_PEAKS = {"H100 SXM": 989e12, "H200 SXM": 989e12, "A100 SXM 80GB": 312e12,
                    "MI300X": 1307.4e12}

USER_HARDWARE = """\
[[link]]
name = "My Fabric"
bandwidth = 100e9
latency = 3e-6

[[accelerator]]
name = "My GPU"
peak_flops = { bf16 = 1.0e15, fp32 = 6.0e13 }
memory_bytes = 96e9
memory_bandwidth = 3.0e12
power_watts = 600
gpus_per_node = 4
intra_link = "My Fabric"
inter_link = { name = "IB NDR", bandwidth = 50e9, latency = 5e-6 }
"""


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """``shardlab ARGV --json``, checked to succeed quietly, as one JSON document."""
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    assert err == ""
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


# -- models ----------------------------------------------------------------------------------


def test_models_json_lists_the_whole_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    rows = cli_json(capsys, "models")["models"]
    assert [r["name"] for r in rows] == list(MODELS)
    for r in rows:
        assert isinstance(r["params"], int) and not isinstance(r["params"], bool)
        assert r["params"] > 0
        assert 0 < r["active_params"] <= r["params"]
        assert r["source"]
    by_name = {r["name"]: r for r in rows}
    assert by_name["llama-3-8b"]["params"] == 8_030_261_248
    assert by_name["gpt3-175b"]["params"] == 174_604_259_328
    # Mixtral routes each token through 2 of 8 experts.
    assert by_name["mixtral-8x7b"]["active_params"] < by_name["mixtral-8x7b"]["params"]


def test_models_json_agrees_with_budget(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {r["name"]: r for r in cli_json(capsys, "models")["models"]}
    for name in ("gpt2", "qwen2.5-7b", "mixtral-8x7b"):
        budget = cli_json(capsys, "budget", name)
        assert budget["params"]["total"] == rows[name]["params"]


def test_models_human_view(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "models")
    assert code == 0, err
    assert err == ""
    for name in MODELS:
        assert name in out, name
    assert "8,030,261,248" in out


# -- hardware --------------------------------------------------------------------------------


def test_hardware_json_dense_bf16_peaks(capsys: pytest.CaptureFixture[str]) -> None:
    doc = cli_json(capsys, "hardware")
    accels = {a["name"]: a for a in doc["accelerators"]}
    for name, peak in DENSE_BF16_PEAKS.items():
        assert accels[name]["peak_flops"]["bf16"] == peak, name
    for a in doc["accelerators"]:
        assert a["memory_bytes"] > 0 and a["memory_bandwidth"] > 0
        assert a["intra_link"]["bandwidth"] > 0 and a["inter_link"]["bandwidth"] > 0
    assert {k["name"] for k in doc["links"]} >= {"NVLink 4", "IB NDR 400G"}


def test_hardware_human_view(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "hardware")
    assert code == 0, err
    assert err == ""
    # Long names may wrap inside a table cell: look for the first words only.
    for name in ("H100 SXM", "H200 SXM", "A100 SXM", "MI300X"):
        assert name in out, name
    assert "NVLink 4" in out


@pytest.fixture
def hardware_file(tmp_path: Path) -> Path:
    path = tmp_path / "hardware.toml"
    path.write_text(USER_HARDWARE)
    return path


def test_hardware_file_entries_are_listed(capsys: pytest.CaptureFixture[str],
                                          hardware_file: Path) -> None:
    doc = cli_json(capsys, "hardware", "--hardware-file", str(hardware_file))
    accels = {a["name"]: a for a in doc["accelerators"]}
    assert "H100 SXM" in accels  # the catalog stays
    mine = accels["My GPU"]
    assert mine["peak_flops"] == {"bf16": 1.0e15, "fp32": 6.0e13}
    assert mine["memory_bytes"] == 96e9
    assert mine["gpus_per_node"] == 4
    assert mine["intra_link"]["name"] == "My Fabric"
    assert mine["intra_link"]["bandwidth"] == 100e9
    assert mine["inter_link"]["name"] == "IB NDR"
    assert "My Fabric" in {k["name"] for k in doc["links"]}


@pytest.mark.parametrize("query", ["My GPU", "my-gpu", "mygpu"])
def test_hardware_file_gpu_is_usable_by_budget(capsys: pytest.CaptureFixture[str],
                                               hardware_file: Path, query: str) -> None:
    doc = cli_json(capsys, "budget", "llama-3-8b", "--gpu", query, "--gpus", "8",
                   "--hardware-file", str(hardware_file))
    assert doc["hardware"]["name"] == "My GPU" and doc["memory"]["capacity"] == 96e9
    assert doc["hardware"]["inter_link"]["bandwidth"] == 50e9
    assert doc["hardware"]["gpus_per_node"] == 4
    # dp=8 spans two 4-device nodes, so data parallelism crosses the network.
    assert doc["comm"]["dp_link"] == "IB NDR"


def test_hardware_human_view_with_file(capsys: pytest.CaptureFixture[str],
                                       hardware_file: Path) -> None:
    code, out, err = run_cli(capsys, "hardware", "--hardware-file", str(hardware_file))
    assert code == 0, err
    assert "My GPU" in out


@pytest.mark.parametrize(("text", "needles"), [
    ("[[accelerator]\n", ["hardware_file", "TOML"]),
    ('[[accelerator]]\nname = "X"\n', ["accelerator[0].peak_flops", "missing"]),
    ('[[accelerator]]\nname = "X"\npeak_flops = { bf16 = -1.0 }\nmemory_bytes = 1e9\n'
     'memory_bandwidth = 1e12\npower_watts = 100\nintra_link = "NVLink 4"\n'
     'inter_link = "IB NDR 400G"\n', ["accelerator[0].peak_flops.bf16", "-1.0"]),
    ('[[link]]\nname = "L"\nbandwidth = 1e9\n', ["link[0].latency", "missing"]),
    # Once ignored (gpus per node silently 8), accepted, or a silent replacement.
    (USER_HARDWARE.replace("gpus_per_node", "gpus_per_nod"),
     ["accelerator[0]", "'gpus_per_nod'", "unknown key", "gpus_per_node"]),
    (USER_HARDWARE.replace("bf16", "bf17"), ["accelerator[0].peak_flops", "'bf17'", "fp8"]),
    (USER_HARDWARE.replace("My GPU", "H100 SXM"), ["accelerator[0].name", "H100 SXM", "taken"]),
], ids=["not-toml", "missing-peak-flops", "negative-peak", "link-missing-latency",
        "unknown-key", "unknown-dtype", "catalog-name"])
def test_bad_hardware_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       text: str, needles: list[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, out, err = run_cli(capsys, "hardware", "--hardware-file", str(path), "--json")
    assert_one_line_error(code, out, err, *needles)


def test_catalogs_in_a_real_process() -> None:
    for command in ("models", "hardware"):
        p = subprocess.run([sys.executable, "-m", "shardlab", command, "--json"],
                           capture_output=True, text=True, timeout=60, check=False)
        assert p.returncode == 0, p.stderr
        assert p.stderr == ""
        assert isinstance(json.loads(p.stdout), dict)


# -- bugs found and fixed: kept as regressions ------------------------------------------------


@pytest.mark.parametrize("text", ["accelerator = 5\n", "accelerator = [1]\n",
                                  '[accelerator]\nname = "X"\n'],
                         ids=["integer", "list-of-integers", "table-not-array"])
def test_malformed_hardware_table_is_one_line(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, out, err = run_cli(capsys, "hardware", "--hardware-file", str(path))
    assert_one_line_error(code, out, err, "accelerator")


def test_non_utf8_hardware_file_is_one_line(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[[accelerator]]\nname = "\xff"\n')
    code, out, err = run_cli(capsys, "hardware", "--hardware-file", str(path))
    assert_one_line_error(code, out, err, "hardware_file")
