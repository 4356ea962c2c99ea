"""``shardlab.config.resolve``: the one way every command names a model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.hf_config import shape_from_hf_config
from shardlab.config.resolve import load_model, model_or_flags
from shardlab.errors import SpecError

DATA = Path(__file__).parent / "data" / "hf"
FLAGS = {"style": "llama", "layers": 2, "d_model": 32, "heads": 4, "kv_heads": None,
         "d_ff": None, "vocab": None, "seq": 16}


def test_a_name_a_config_json_or_its_folder(tmp_path: Path) -> None:
    assert load_model("llama-3-8b") == get_model("llama-3-8b")
    path = DATA / "qwen2.5-7b.json"
    assert load_model(str(path)) == shape_from_hf_config(path)
    folder = tmp_path / "qwen"
    folder.mkdir()
    shutil.copy(path, folder / "config.json")
    assert load_model(str(folder)).d_model == shape_from_hf_config(path).d_model
    with pytest.raises(SpecError, match="model"):
        load_model("  ")
    with pytest.raises(SpecError):
        load_model(str(tmp_path / "absent.json"))


def test_flags_or_a_model_and_the_corpus_vocabulary() -> None:
    shape = model_or_flags(None, 100, **FLAGS)
    assert (shape.name, shape.layers, shape.d_model, shape.vocab, shape.context) == (
        "flags", 2, 32, 100, 16)
    assert not shape.tied and model_or_flags(None, 100, **{**FLAGS, "style": "gpt"}).tied
    assert model_or_flags("gpt2", 100, **FLAGS) == get_model("gpt2")
    with pytest.raises(SpecError, match="vocab=50: must be >= the corpus's 100 words"):
        model_or_flags(None, 100, **{**FLAGS, "vocab": 50})
    with pytest.raises(SpecError, match="vocab"):
        model_or_flags("gpt2", 10**6, **FLAGS)
