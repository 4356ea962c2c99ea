"""The limits of ``shardlab.config.limits``, input files, and error lines that stay readable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.files import check_input_file, read_input_text
from shardlab.config.layout import make_layout
from shardlab.config.limits import (
    MAX_BATCH,
    MAX_CONTEXT,
    MAX_FILE_BYTES,
    MAX_GPUS,
    MAX_LAYERS,
)
from shardlab.config.model import SHAPE_LIMITS, ModelShape, MoE
from shardlab.config.resolve import FLAGS_NAME, load_model, model_field, model_label
from shardlab.errors import SpecError, clip

BASE = {"name": "m", "layers": 2, "d_model": 64, "heads": 4, "vocab": 100, "context": 32,
        "style": "llama"}


@pytest.mark.parametrize("field", sorted(SHAPE_LIMITS))
def test_each_shape_field_is_bounded(field: str) -> None:
    over = SHAPE_LIMITS[field] + 1
    with pytest.raises(SpecError) as e:
        ModelShape(**{**BASE, field: over})
    assert e.value.field == field and e.value.value == over
    assert f"must be <= {SHAPE_LIMITS[field]:,}" in str(e.value)


def test_a_shape_at_the_limits_is_accepted() -> None:
    m = ModelShape(**{**BASE, "layers": MAX_LAYERS, "vocab": 2**24, "context": 2**24})
    assert (m.layers, m.vocab, m.context) == (MAX_LAYERS, 2**24, 2**24)


def test_a_30_digit_width_is_refused_not_printed() -> None:
    # A config.json with hidden_size 1e30 once printed totals smaller than their parts.
    with pytest.raises(SpecError, match=r"d_model=10{30}: must be <= 1,048,576 \(2\^20\)"):
        ModelShape(**{**BASE, "d_model": 10**30})


@pytest.mark.parametrize("field", ["experts", "shared_experts", "expert_d_ff", "shared_d_ff"])
def test_moe_fields_are_bounded(field: str) -> None:
    kw = {"experts": 8, "experts_per_token": 2, "expert_d_ff": 64, field: 2**30}
    with pytest.raises(SpecError) as e:
        MoE(**kw)
    assert e.value.field == f"moe.{field}"


@pytest.mark.parametrize(("kw", "field"), [
    ({"gpus": MAX_GPUS * 2}, "gpus"), ({"dp": MAX_GPUS + 1}, "dp"), ({"tp": 10**40}, "tp"),
    ({"pp": MAX_GPUS + 1}, "pp"), ({"virtual_stages": MAX_LAYERS + 1}, "virtual_stages"),
    ({"micro_batch": MAX_BATCH + 1}, "micro_batch"),
    ({"global_batch": MAX_BATCH + 1}, "global_batch"), ({"seq": MAX_CONTEXT + 1}, "seq"),
])
def test_layout_counts_are_bounded(kw: dict, field: str) -> None:
    with pytest.raises(SpecError) as e:
        make_layout(get_model("llama-3-8b"), **kw)
    assert e.value.field == field and "must be <=" in str(e.value)


def test_an_over_long_value_is_cut_in_the_message() -> None:
    e = SpecError("model", "x" * 100_000, "unknown")
    line = str(e)
    assert len(line) < 240 and line.endswith("... (99,842 more characters): unknown")
    assert e.value == "x" * 100_000  # the value itself is kept whole
    assert str(SpecError("tp", 3, "must divide heads (32)")) == "tp=3: must divide heads (32)"
    assert clip("a" * 160) == "a" * 160
    assert clip("a" * 161) == "a" * 160 + "... (1 more character)"


def test_a_deep_file_path_is_echoed_whole() -> None:
    # A user must see which file: paths under deep folders run well past 100 characters.
    path = "/home/someone/projects/" + "/".join(["a-long-folder-name"] * 6) + "/config.json"
    assert 140 < len(path) < 160
    assert str(SpecError("config", path, "is not valid JSON")) == (
        f"config={path!r}: is not valid JSON")


def test_only_small_regular_files_are_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    big = tmp_path / "big.json"
    big.write_text("{}" + " " * MAX_FILE_BYTES)
    for path, needle in (("/dev/zero", "regular file"), (fifo, "regular file"),
                         (tmp_path, "regular file"), (big, "1,048,576 bytes"),
                         (tmp_path / "absent.json", "cannot be read")):
        with pytest.raises(SpecError, match="config") as e:
            check_input_file("config", path)
        assert needle in str(e.value)
    ok = tmp_path / "ok.toml"
    ok.write_text("x = 1\n")
    assert read_input_text("hardware_file", ok) == "x = 1\n"


def test_a_model_path_is_checked_before_it_is_read(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"config='/dev/zero': must be a regular file"):
        load_model("/dev/zero")
    big = tmp_path / "big.json"
    big.write_text('{"model_type": "llama"}' + " " * MAX_FILE_BYTES)
    with pytest.raises(SpecError, match="at most 1,048,576 bytes"):
        load_model(str(big))


@pytest.mark.parametrize("name", ["x" * 100_000, "x" * 5000 + ".json", "a/" * 3000])
def test_a_name_too_long_for_the_file_system_is_one_spec_error(name: str) -> None:
    with pytest.raises(SpecError) as e:
        load_model(name)
    assert e.value.field == "model" and "File name too long" in str(e.value)
    assert len(str(e.value)) < 330


def test_messages_name_the_shape_flags_not_a_model_called_flags() -> None:
    flags = ModelShape(FLAGS_NAME, 2, 64, 4, 100, 32, style="llama")
    assert model_field(flags) == ("shape flags", flags.describe())
    assert model_label(flags) == "the model of the shape flags"
    gpt2 = get_model("gpt2")
    assert model_field(gpt2) == ("model", "gpt2") and model_label(gpt2) == "gpt2"
