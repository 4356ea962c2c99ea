"""``shardlab budget``'s bad input: exit code 2, nothing on stdout, one line on stderr that
names the bad value, no traceback; in-process through :func:`shardlab.cli.main`, and
three of them in a real ``python -m shardlab`` process, where the process boundary is
the point (no traceback reaches stderr)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.cli.budget_cli_support import (
    LLAMA3_CONFIG,
    assert_one_line_error,
    run_cli,
    shardlab_process,
)

# -- bad input -------------------------------------------------------------------------------


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, str]:
    """Broken config.json files, by the name a BAD_INPUT entry uses for them."""
    not_json = tmp_path / "not-json.json"
    not_json.write_text("{ this is not JSON\n")
    bert = tmp_path / "bert.json"
    bert.write_text(json.dumps({"model_type": "bert", "hidden_size": 768,
                                "num_hidden_layers": 12, "num_attention_heads": 12}))
    no_hidden = tmp_path / "no-hidden.json"
    config = json.loads(LLAMA3_CONFIG.read_text())
    del config["hidden_size"]
    no_hidden.write_text(json.dumps(config))
    huge = tmp_path / "huge.json"  # once printed 30-digit figures, totals below their parts
    huge.write_text(json.dumps({**json.loads(LLAMA3_CONFIG.read_text()), "hidden_size": 10**30}))
    big = tmp_path / "big.json"
    big.write_text(LLAMA3_CONFIG.read_text() + " " * 2**20)
    return {"not_json": str(not_json), "bert": str(bert), "no_hidden": str(no_hidden),
            "huge": str(huge), "big": str(big)}


# (id, argv after `budget` with {placeholders} for bad_files, strings the error line names)
BAD_INPUT: list[tuple[str, list[str], list[str]]] = [
    ("unknown-model", ["llama-3-9b"], ["model", "llama-3-9b", "llama-3-8b"]),
    ("config-not-json", ["{not_json}"], ["{not_json}", "JSON"]),
    ("config-unknown-family", ["{bert}"], ["model_type", "bert"]),
    ("config-missing-hidden-size", ["{no_hidden}"], ["hidden_size", "missing"]),
    ("tp-zero", ["llama-3-8b", "--tp", "0"], ["--tp", "0"]),
    ("tp-negative", ["llama-3-8b", "--tp", "-2"], ["--tp", "-2"]),
    ("gpus-zero", ["llama-3-8b", "--gpus", "0"], ["--gpus", "0"]),
    ("mfu-zero", ["llama-3-8b", "--mfu", "0"], ["--mfu", "0"]),
    ("mfu-above-one", ["llama-3-8b", "--mfu", "1.5"], ["--mfu", "1.5"]),
    ("mfu-not-a-number", ["llama-3-8b", "--mfu", "abc"], ["--mfu", "abc"]),
    # Accepted once: an HFU above 100%, a 300-digit step time, an infinite cost.
    ("mfu-one-with-flash", ["llama-3-8b", "--mfu", "1"], ["mfu=1.0", "HFU of 103.7%",
                                                          "at most 0.964"]),
    ("mfu-tiny", ["llama-3-8b", "--mfu", "1e-300"], ["--mfu", "from 0.0001 to 1"]),
    ("price-huge", ["llama-3-8b", "--price-per-gpu-hour", "1e308"],
     ["--price-per-gpu-hour", "from 0 to 1e+06"]),
    ("tokens-huge", ["llama-3-8b", "--tokens", "1e308"], ["--tokens", "from 1 to 1e+18"]),
    ("decode-context-huge", ["llama-3-8b", "--decode-context", "1e8"],
     ["--decode-context", "at most 16,777,216"]),
    ("tp-not-dividing-heads", ["llama-3-8b", "--tp", "3"], ["tp", "3", "heads"]),
    ("zero-4", ["llama-3-8b", "--zero", "4"], ["zero", "4"]),
    ("recompute-unknown", ["llama-3-8b", "--recompute", "sometimes"],
     ["--recompute", "sometimes"]),
    ("dtype-unknown", ["llama-3-8b", "--dtype", "fp8x"], ["dtype", "fp8x", "bf16"]),
    ("gpu-unknown", ["llama-3-8b", "--gpu", "H900"], ["gpu", "H900"]),
    ("gpus-not-multiple-of-tp", ["llama-3-8b", "--gpus", "10", "--tp", "4"], ["gpus", "10"]),
    ("gpus-not-dp-tp-pp", ["llama-3-8b", "--gpus", "8", "--dp", "2"], ["gpus", "8"]),
    ("model-and-params", ["llama-3-8b", "--params", "7e9"], ["MODEL", "--params"]),
    ("neither-model-nor-params", [], ["MODEL", "--params"]),
    ("params-zero-4", ["--params", "7.5e9", "--zero", "4"], ["zero", "4"]),
    ("params-gpus-not-multiple", ["--params", "7.5e9", "--gpus", "10", "--tp", "4"],
     ["gpus", "10"]),
    ("params-not-positive", ["--params", "0"], ["--params", "0"]),
    ("hardware-file-missing", ["llama-3-8b", "--hardware-file", "/nonexistent/hw.toml"],
     ["hardware_file", "/nonexistent/hw.toml"]),
    # Once a read without end, a 100,000-character OSError, 30-digit figures, "0.50
    # parameters", "must be a positive integer" for a flag that takes 0.
    ("config-a-device", ["/dev/zero"], ["config", "/dev/zero", "regular file"]),
    ("config-over-1-mib", ["{big}"], ["config", "1,048,576 bytes"]),
    ("config-30-digit-width", ["{huge}"], ["d_model", "2^20"]),
    ("model-name-too-long", ["x" * 100_000], ["model", "more characters", "too long"]),
    ("recompute-too-long", ["gpt2", "--recompute", "y" * 5000], ["--recompute", "more char"]),
    ("params-below-one", ["--params", "0.5"], ["--params", "0.5", "from 1"]),
    ("params-over-2-53", ["--params", "1e30"], ["--params", "2^53"]),
    ("zero-negative", ["llama-3-8b", "--zero", "-1"], ["--zero", "an integer >= 0"]),
    ("gpus-over-limit", ["llama-3-8b", "--gpus", "1e9"], ["gpus", "2^20"]),
    ("tp-infinite", ["llama-3-8b", "--tp", "inf"], ["--tp", "inf"]),
    ("tp-1e400", ["llama-3-8b", "--tp", "1e400"], ["--tp", "1e400"]),
    ("params-dp-contradicts-gpus", ["--params", "7.5e9", "--gpus", "64", "--dp", "2"],
     ["gpus", "64"]),
    ("params-gpus-over-limit", ["--params", "7B", "--gpus", "1e30"], ["gpus", "2^20"]),
]


@pytest.mark.parametrize(("argv", "needles"), [(a, n) for _, a, n in BAD_INPUT],
                         ids=[i for i, _, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                          bad_files: dict[str, str], argv: list[str],
                                          needles: list[str]) -> None:
    argv = [a.format(**bad_files) for a in argv]
    code, out, err = run_cli(capsys, "budget", *argv, "--json")
    assert_one_line_error(code, out, err, *(n.format(**bad_files) for n in needles))


@pytest.mark.parametrize(("argv", "needles"), [
    (["budget", "llama-3-9b", "--json"], ["llama-3-9b", "llama-3-8b"]),  # a SpecError
    (["budget", "llama-3-8b", "--mfu", "abc"], ["--mfu", "abc"]),  # an argparse error
    (["budget", "{bert}", "--json"], ["model_type", "bert"]),  # a config.json error
], ids=["unknown-model", "bad-mfu", "bert-config"])
def test_bad_input_in_a_real_process_has_no_traceback(bad_files: dict[str, str],
                                                      argv: list[str],
                                                      needles: list[str]) -> None:
    p = shardlab_process(*(a.format(**bad_files) for a in argv))
    assert_one_line_error(p.returncode, p.stdout, p.stderr,
                          *(n.format(**bad_files) for n in needles))
