"""``shardlab budget`` on the command line: the JSON contract, loose names, the human view,
when a layout does not fit. (Bad input: ``test_budget_cli_bad_input.py``.)

Most tests call :func:`shardlab.cli.main` in-process and read stdout/stderr with
``capsys`` (fast); a few start ``python -m shardlab`` where the process boundary is
the point (torch is never imported, a closed pipe, exit codes).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.cli.budget_cli_support import (
    LLAMA3_CONFIG,
    assert_one_line_error,
    run_cli,
    shardlab_process,
)

LLAMA3_8B_PARAMS = 8_030_261_248  # sum of numel over meta-llama/Meta-Llama-3-8B's tensors
GPT3_175B_PARAMS = 174_604_259_328

# Dotted fields every model budget carries, each a finite number in base units.
NUMERIC_FIELDS = (
    "params.total", "params.attention", "params.mlp", "params.embedding", "params.head",
    "flops.forward_per_token", "flops.train_per_token", "flops.hardware_train_per_token",
    "flops.train_total", "flops.train_6nd",
    "memory.per_device.weights", "memory.per_device.gradients", "memory.per_device.optimizer",
    "memory.per_device.activations", "memory.per_device.total", "memory.activations_per_layer",
    "time.train_days",
    "comm.dp_bytes_per_step", "comm.tp_bytes_per_step", "comm.pp_bytes_per_step",
    "inference.kv_bytes_per_token",
    "inference.decode.seconds", "inference.decode.tokens_per_s",
)


# -- helpers ---------------------------------------------------------------------------------


def _no_constants(name: str) -> Any:
    raise AssertionError(f"stdout holds {name}, which is not JSON")


def parse_one_document(out: str) -> dict[str, Any]:
    """The whole of stdout as exactly one strict JSON document (no NaN/Infinity)."""
    doc = json.loads(out, parse_constant=_no_constants)
    assert isinstance(doc, dict)
    return doc


def budget_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """``shardlab budget ARGV --json``, checked to succeed quietly, as a dict."""
    code, out, err = run_cli(capsys, "budget", *argv, "--json")
    assert code == 0, err
    assert err == ""
    return parse_one_document(out)


def dotted(doc: dict[str, Any], path: str) -> Any:
    """``doc["a"]["b"]`` for ``"a.b"``; a KeyError names the missing part."""
    value: Any = doc
    for part in path.split("."):
        assert isinstance(value, dict) and part in value, f"{path}: no {part!r}"
        value = value[part]
    return value


def is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


# -- the JSON document -----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["llama-3-8b", "gpt3-175b", "mixtral-8x7b", "gpt2"])
def test_json_is_one_document_with_the_documented_fields(
        capsys: pytest.CaptureFixture[str], model: str) -> None:
    doc = budget_json(capsys, model)
    for path in NUMERIC_FIELDS:
        value = dotted(doc, path)
        assert is_number(value), f"{path} = {value!r}"
    assert isinstance(dotted(doc, "memory.fits"), bool)
    assert dotted(doc, "inference.decode.bound") in ("compute", "memory")


def test_json_parts_sum_to_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    p = budget_json(capsys, "llama-3-8b")["params"]
    parts = ("attention", "mlp", "experts", "router", "norms", "embedding", "position", "head")
    assert sum(p.get(k, 0) for k in parts) == p["total"]


@pytest.mark.parametrize(("model", "total"), [
    ("llama-3-8b", LLAMA3_8B_PARAMS), ("gpt3-175b", GPT3_175B_PARAMS),
])
def test_exact_parameter_counts(capsys: pytest.CaptureFixture[str], model: str,
                                total: int) -> None:
    assert budget_json(capsys, model)["params"]["total"] == total


def test_kv_cache_bytes_per_token_llama3_bf16(capsys: pytest.CaptureFixture[str]) -> None:
    doc = budget_json(capsys, "llama-3-8b", "--dtype", "bf16")
    # K and V x 32 layers x 8 kv heads x head_dim 128 x 2 bytes.
    assert doc["inference"]["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131072


def test_recompute_costs_hardware_flops_only(capsys: pytest.CaptureFixture[str]) -> None:
    # Eager attention: with flash (the default) even "none" recomputes Q·Kᵀ in backward.
    f = {r: budget_json(capsys, "llama-3-8b", "--recompute", r, "--attention", "eager")["flops"]
         for r in ("none", "selective", "full")}
    # The model FLOPs (what MFU counts) do not change with recompute.
    assert f["none"]["train_per_token"] == f["selective"]["train_per_token"] \
        == f["full"]["train_per_token"]
    assert f["none"]["hardware_train_per_token"] == f["none"]["train_per_token"]
    assert f["full"]["hardware_train_per_token"] > f["full"]["train_per_token"]
    assert (f["none"]["hardware_train_per_token"] < f["selective"]["hardware_train_per_token"]
            < f["full"]["hardware_train_per_token"])


def test_zero1_shards_the_optimizer_over_dp(capsys: pytest.CaptureFixture[str]) -> None:
    z0 = budget_json(capsys, "llama-3-8b", "--gpus", "8", "--zero", "0")
    z1 = budget_json(capsys, "llama-3-8b", "--gpus", "8", "--zero", "1")
    assert z0["layout"]["dp"] == z1["layout"]["dp"] == 8
    m0, m1 = z0["memory"]["per_device"], z1["memory"]["per_device"]
    assert m1["optimizer"] == pytest.approx(m0["optimizer"] / 8, rel=1e-12)
    # ZeRO-1 leaves weights and gradients whole.
    assert m1["weights"] == m0["weights"]
    assert m1["gradients"] == m0["gradients"]


def test_gpt3_does_not_fit_one_h100(capsys: pytest.CaptureFixture[str]) -> None:
    doc = budget_json(capsys, "gpt3-175b", "--gpu", "H100 SXM")
    assert doc["layout"]["gpus"] == 1
    assert doc["memory"]["fits"] is False
    assert doc["memory"]["per_device"]["total"] > doc["memory"]["capacity"]


def test_config_json_path_is_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    from_file = budget_json(capsys, str(LLAMA3_CONFIG))
    from_catalog = budget_json(capsys, "llama-3-8b")
    assert from_file["params"]["total"] == from_catalog["params"]["total"] == LLAMA3_8B_PARAMS
    assert from_file["flops"] == from_catalog["flops"]


def test_snapshot_folder_is_a_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    shutil.copy(LLAMA3_CONFIG, folder / "config.json")
    doc = budget_json(capsys, str(folder))
    assert doc["params"]["total"] == LLAMA3_8B_PARAMS
    assert doc["model"]["name"] == "Meta-Llama-3-8B"


# -- a bare parameter count ------------------------------------------------------------------


def test_params_only_budget(capsys: pytest.CaptureFixture[str]) -> None:
    doc = budget_json(capsys, "--params", "7.5e9", "--gpus", "64")
    n = 7.5e9
    tokens = doc["assumptions"]["tokens"]
    assert tokens == 20 * n  # the Chinchilla default
    assert doc["params"]["total"] == n
    assert doc["flops"]["train_6nd"] == pytest.approx(6 * n * tokens, rel=1e-12)
    # bf16 mixed precision with Adam, ZeRO-0: 2 + 2 + 12 bytes per parameter.
    assert doc["memory"]["per_device"]["total"] == pytest.approx(16 * n, rel=1e-12)
    seconds = 6 * n * tokens / (64 * doc["hardware"]["peak_flops"] * doc["assumptions"]["mfu"])
    assert doc["time"]["train_days"] == pytest.approx(seconds / 86400, rel=1e-9)


@pytest.mark.parametrize(("text", "n"), [("7B", 7e9), ("1.5t", 1.5e12), ("125M", 125e6),
                                         ("1", 1.0)])
def test_params_take_a_suffix(capsys: pytest.CaptureFixture[str], text: str, n: float) -> None:
    assert budget_json(capsys, "--params", text)["params"]["total"] == n


def test_params_only_budget_takes_explicit_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    doc = budget_json(capsys, "--params", "7.5e9", "--gpus", "64", "--tokens", "1e12")
    assert doc["assumptions"]["tokens"] == 1e12
    assert doc["flops"]["train_6nd"] == pytest.approx(6 * 7.5e9 * 1e12, rel=1e-12)


# -- hardware --------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "name"), [
    ("a100", "A100 SXM 80GB"), ("A100", "A100 SXM 80GB"), ("nvidia a100", "A100 SXM 80GB"),
    ("h200", "H200 SXM"), ("H100 SXM", "H100 SXM"), ("mi300x", "MI300X"),
])
def test_loose_gpu_names(capsys: pytest.CaptureFixture[str], query: str, name: str) -> None:
    assert budget_json(capsys, "llama-3-8b", "--gpu", query)["hardware"]["name"] == name


def test_user_gpu_needs_the_hardware_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "budget", "llama-3-8b", "--gpu", "My GPU", "--json")
    assert_one_line_error(code, out, err, "gpu", "My GPU")


# -- the human view --------------------------------------------------------------------------


def test_human_view_prints_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "budget", "llama-3-8b")
    assert code == 0, err
    assert err == ""
    for title in ("Parameters", "FLOPs", "Memory per device", "Training time", "Communication",
                  "Inference"):
        assert title in out, title
    assert "llama-3-8b" in out
    assert "H100 SXM" in out


def test_human_view_of_a_bare_parameter_count(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "budget", "--params", "7.5e9", "--gpus", "64")
    assert code == 0, err
    for title in ("Parameters", "Memory per device", "Training time", "Communication"):
        assert title in out, title
    assert "Inference" not in out  # needs a shape


# -- process boundary ------------------------------------------------------------------------


def test_json_in_a_real_process(tmp_path: Path) -> None:
    p = shardlab_process("budget", "llama-3-8b", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert parse_one_document(p.stdout)["params"]["total"] == LLAMA3_8B_PARAMS


def test_budget_does_not_import_torch() -> None:
    code = ("import sys\n"
            "from shardlab.cli import main\n"
            "rc = main(['budget', 'hypo-100b', '--json'])\n"
            "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
            "sys.stderr.write(f'{rc} {heavy}')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "0 []"
    parse_one_document(p.stdout)


# -- bugs found and fixed: kept as regressions ------------------------------------------------


def _closed_pipe_run(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run shardlab with stdout a pipe whose reader is already gone (`... | head -0`)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return shardlab_process(*argv, stdout=write_end)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("json_flag", [["--json"], []], ids=["json", "human"])
def test_closed_pipe_exits_0(json_flag: list[str]) -> None:
    p = _closed_pipe_run("budget", "llama-3-8b", *json_flag)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr


def test_hfu_counts_recompute(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "budget", "gpt2", "--recompute", "full", "--mfu", "0.5",
                           "--json")
    doc = json.loads(out)
    ratio = doc["flops"]["hardware_train_per_token"] / doc["flops"]["train_per_token"]
    assert code == 0 and doc["time"]["mfu"] == 0.5
    assert doc["time"]["hfu"] == pytest.approx(0.5 * ratio, rel=1e-12) and ratio > 1.2


# -- when a layout does not fit --------------------------------------------------------------


FIT_KEYS = {"change", "memory_bytes", "fits", "step_seconds", "step_ratio"}
# Llama-3-8B on 8 H100s, ZeRO-0, 8 sequences of 8,192 tokens per micro-batch: 455 GB.
TOO_BIG = ("llama-3-8b", "--gpus", "8", "--micro-batch", "8", "--seq", "8192",
           "--global-batch", "64")


def test_a_layout_that_does_not_fit_gets_the_changes_that_make_it_fit(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = budget_json(capsys, *TOO_BIG, "--zero", "0")
    fit, mem = doc["fit"], doc["memory"]
    assert not mem["fits"] and fit["binding"] == "activations"
    assert fit["memory_bytes"] == mem["per_device"]["total"]
    assert fit["capacity"] == mem["capacity"]
    for c in [*fit["changes"], *fit["pairs"]]:
        assert set(c) >= FIT_KEYS and all(is_number(c[k]) for k in FIT_KEYS - {"change", "fits"})
    assert not any(c["fits"] for c in fit["changes"])
    (pair,) = fit["pairs"]
    assert pair["change"] == "zero=3 recompute=full" and pair["fits"]
    # Each change's memory is what a fresh budget of the changed layout says.
    fresh = budget_json(capsys, *TOO_BIG, "--zero", "3", "--recompute", "full")
    assert fresh["memory"]["fits"] and fresh["fit"] is None
    assert pair["memory_bytes"] == fresh["memory"]["per_device"]["total"]
    tp2 = next(c for c in fit["changes"] if c["change"] == "tp=2 dp=4")
    fresh = budget_json(capsys, *TOO_BIG, "--zero", "0", "--tp", "2")
    assert tp2["memory_bytes"] == fresh["memory"]["per_device"]["total"]
    assert tp2["fits"] is fresh["memory"]["fits"] is False
    assert fresh["fit"]["step_seconds"] == tp2["step_seconds"]


def test_the_human_view_says_what_binds_and_what_fits(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    code, out, err = run_cli(capsys, "budget", *TOO_BIG, "--zero", "0")
    assert code == 0, err
    assert out.index("Memory per device") < out.index("What binds: activations") \
        < out.index("To make it fit") < out.index("Training time")
    assert "zero=3 recompute=full" in out and "not tried: sp=1" in out
    code, out, _ = run_cli(capsys, "budget", "llama-3-8b", "--gpus", "8", "--zero", "3")
    assert code == 0 and "What binds" not in out


def test_a_bare_parameter_count_has_no_fit_advice(capsys: pytest.CaptureFixture[str]) -> None:
    doc = budget_json(capsys, "--params", "70e9", "--gpus", "8")
    assert not doc["memory"]["fits"] and doc["fit"] is None
