"""``shardlab import`` on bad input: every refusal is exit 2 and one line naming the field,
and nothing is left where the output was to go (no folder, no temporary beside it).

The Hugging Face folders are built here from a tiny llama-style TransformerLM (hf_config
and to_hf, what export writes), then edited: no training, no checkpoint.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from safetensors import SafetensorError
from safetensors.torch import save_file

import shardlab.hf.weights as weights
from shardlab.cli import main
from shardlab.config.hf_export import hf_config
from shardlab.config.model import ModelShape
from shardlab.hf.weights import read_weights, to_hf
from shardlab.nn.model import TransformerLM

# The error line clips a long value (a pytest tmp path): tests check field and reason.
OUT_DIR = "shardlab import: error: out_dir="
SHAPE = ModelShape("tiny-llama", 2, 16, 2, 40, 16, kv_heads=1, style="llama", tied=False)


def hf_folder(root: Path, config_edits: dict[str, Any] | None = None,
              tensor_edit: tuple[str, float] | None = None) -> Path:
    """``root/hf``: config.json (with ``config_edits``; a value of ... deletes the key) and
    model.safetensors, one element of the tensor ``tensor_edit[0]`` set to ``[1]``."""
    folder = root / "hf"
    folder.mkdir()
    config = hf_config(SHAPE)
    for key, value in (config_edits or {}).items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    tensors = to_hf(TransformerLM(SHAPE).state_dict(), SHAPE)
    if tensor_edit is not None:
        tensors[tensor_edit[0]].view(-1)[3] = tensor_edit[1]
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a command that must exit 2 and print nothing on stdout."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err


def left_in(root: Path) -> set[str]:
    """What a refused import left in ``root`` besides the source folder: must be nothing."""
    return {p.name for p in root.iterdir()} - {"hf"}


# --- positions shardlab's model cannot compute (finding 3) and bad JSON types (finding 7) ---

POSITION_CASES = [
    # transformers 5.x reads a truthy rope_scaling *instead of* rope_parameters, and the
    # legacy key "type" as rope_type: each of these is linear/yarn scaling there.
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.type='linear'"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": ...},
     "rope_scaling.type='linear'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type='yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0}},
     "rope_parameters.rope_type='llama3'"),
    ({"rope_scaling": {"rope_type": "default", "rope_theta": 1e6}},
     "rope_scaling.rope_theta=1000000.0"),
    ({"rope_theta": None}, "rope_theta=None"),
    ({"rope_theta": "abc"}, "rope_theta='abc'"),
    ({"rope_theta": [1]}, "rope_theta=[1]"),
    ({"rope_theta": True}, "rope_theta=True"),
    ({"rope_parameters": {"rope_theta": "abc"}}, "rope_parameters.rope_theta='abc'"),
    ({"rope_scaling": "linear"}, "rope_scaling='linear'"),
    ({"rope_parameters": [10000]}, "rope_parameters=[10000]"),
    ({"rms_norm_eps": "abc"}, "rms_norm_eps='abc'"),
    ({"rms_norm_eps": [1e-6]}, "rms_norm_eps=[1e-06]"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
]


@pytest.mark.parametrize(("edits", "named"), POSITION_CASES,
                         ids=[c[1].split("=")[0] + f"-{i}" for i, c in enumerate(POSITION_CASES)])
def test_positions_and_fields_it_cannot_compute_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], edits: dict[str, Any],
        named: str) -> None:
    hf = hf_folder(tmp_path, edits)
    err = refused(["import", str(hf), str(tmp_path / "out")], capsys)
    assert err.startswith("shardlab import: error: " + named), err
    assert left_in(tmp_path) == set()


@pytest.mark.parametrize("edits", [
    {"rope_scaling": None},
    {"rope_scaling": {"rope_type": "default"}, "rope_theta": 10000},
    {"rope_parameters": ..., "rope_theta": ...},  # LlamaConfig's defaults: 10 000, unscaled
], ids=["scaling-null", "scaling-default", "all-absent"])
def test_unscaled_positions_are_accepted(tmp_path: Path, edits: dict[str, Any]) -> None:
    hf = hf_folder(tmp_path, edits)
    assert main(["import", str(hf), str(tmp_path / "out")]) == 0
    assert read_weights(tmp_path / "out").keys() == TransformerLM(SHAPE).state_dict().keys()


# --- weights (finding 15) ------------------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        value: float) -> None:
    name = "model.layers.1.mlp.up_proj.weight"
    hf = hf_folder(tmp_path, tensor_edit=(name, value))
    err = refused(["import", str(hf), str(tmp_path / "out")], capsys)
    assert f"weights='{name}'" in err and "NaN or infinite" in err
    assert left_in(tmp_path) == set()


# --- the output folder (findings 5, 6, 22, 24) --------------------------------------------

# A full disk as the writer reports it: an OSError, or (what safetensors' Rust writer
# really raises, seen on a full 64 KiB tmpfs) its own SafetensorError.
FULL_DISK = [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
             SafetensorError("Error while serializing: I/O error: No space left on device "
                             "(os error 28)")]


@pytest.mark.parametrize("error", FULL_DISK, ids=["OSError", "SafetensorError"])
def test_a_write_error_midway_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch,
                                             error: Exception) -> None:
    hf = hf_folder(tmp_path)

    def full_disk(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(weights, "save_file", full_disk)
    out = tmp_path / "out"
    err = refused(["import", str(hf), str(out)], capsys)
    assert err.startswith(OUT_DIR) and "No space left on device" in err
    assert left_in(tmp_path) == set()
    # ... so the rerun (disk freed) is not refused as "not empty"
    monkeypatch.undo()
    assert main(["import", str(hf), str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {weights.CONFIG, weights.WEIGHTS, weights.MARKER}


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["022", "027"])
def test_files_get_the_mode_the_umask_gives(tmp_path: Path, umask: int) -> None:
    hf = hf_folder(tmp_path)
    old = os.umask(umask)
    try:
        assert main(["import", str(hf), str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f.name


def test_an_empty_folder_is_filled(tmp_path: Path) -> None:
    hf = hf_folder(tmp_path)
    (tmp_path / "out").mkdir()
    assert main(["import", str(hf), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / weights.MARKER).is_file() and left_in(tmp_path) == {"out"}


def test_a_missing_parent_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf = hf_folder(tmp_path)
    out = tmp_path / "no" / "deep" / "out"
    err = refused(["import", str(hf), str(out)], capsys)
    assert err.startswith(OUT_DIR) and "does not exist" in err
    assert left_in(tmp_path) == set()


def test_a_file_as_output_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf = hf_folder(tmp_path)
    (tmp_path / "out").write_text("mine")
    err = refused(["import", str(hf), str(tmp_path / "out")], capsys)
    assert err.startswith(OUT_DIR) and "is a file" in err
    assert (tmp_path / "out").read_text() == "mine" and left_in(tmp_path) == {"out"}


def test_a_read_only_file_system_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    hf = hf_folder(tmp_path)
    real_mkdir = os.mkdir

    def read_only(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).parent == tmp_path:  # as EROFS on the output's file system
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only)
    out = tmp_path / "out"
    err = refused(["import", str(hf), str(out)], capsys)
    assert err.startswith(OUT_DIR) and "Read-only file system" in err
    assert left_in(tmp_path) == set()
