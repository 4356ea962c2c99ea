"""shape_from_hf_config: Hugging Face config.json files into ModelShapes.

The fixtures under data/hf/ copy the published config.json files field for field
(meta-llama/Meta-Llama-3-8B, mistralai/Mistral-7B-v0.1, mistralai/Mixtral-8x7B-v0.1,
Qwen/Qwen2.5-7B, openai-community/gpt2, mistralai/Mistral-Nemo-Base-2407); the
expected totals are the checkpoints' exact parameter counts. (What the importer refuses:
``test_hf_config_refusals.py``.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tests.config.hf_config_support import CATALOG_CASES, DATA, edited, fixture, write

from shardlab.config.catalog import get_model
from shardlab.config.hf_config import shape_from_hf_config
from shardlab.config.hf_export import hf_config
from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError
from shardlab.estimate.params import count_params

# --- published checkpoints --------------------------------------------------------------


@pytest.mark.parametrize(("stem", "total"), CATALOG_CASES)
def test_published_config_matches_catalog(stem: str, total: int) -> None:
    shape = shape_from_hf_config(DATA / f"{stem}.json")
    entry = get_model(stem)
    assert count_params(shape).total == total
    assert count_params(shape).total == count_params(entry).total
    # Not just the total: every field the catalog fixes agrees (name and source aside).
    assert dataclasses.replace(shape, name=entry.name) == entry


def test_mistral_nemo_uses_explicit_head_dim() -> None:
    shape = shape_from_hf_config(DATA / "mistral-nemo-12b.json")
    assert shape.head_dim == 128  # not hidden_size / heads = 5120 / 32 = 160
    assert (shape.q_dim, shape.kv_dim) == (4096, 1024)
    assert not shape.tied
    # By hand, per layer (d=5120, q=32*128=4096, k=v=8*128=1024, f=14336):
    #   attention  5120*4096 + 2*5120*1024 + 4096*5120 = 52,428,800
    #   SwiGLU MLP 3*5120*14336                          = 220,200,960
    #   2 RMSNorms 2*5120                                = 10,240
    #   layer total                                      = 272,640,000; x40 = 10,905,600,000
    # embedding 131072*5120 = 671,088,640, untied lm_head the same: 1,342,177,280
    # final RMSNorm 5,120
    # total 10,905,600,000 + 1,342,177,280 + 5,120 = 12,247,782,400
    assert count_params(shape).total == 12_247_782_400


def test_mixtral_experts() -> None:
    shape = shape_from_hf_config(DATA / "mixtral-8x7b.json")
    assert shape.moe == MoE(experts=8, experts_per_token=2, expert_d_ff=14336)
    assert shape.d_ff == 14336
    assert shape.moe.router_bias is False


def test_qwen2_has_qkv_bias_and_gpt2_is_gpt_style() -> None:
    qwen = shape_from_hf_config(DATA / "qwen2.5-7b.json")
    gpt2 = shape_from_hf_config(DATA / "gpt2.json")
    assert qwen.qkv_bias and qwen.style == "llama" and not qwen.tied
    assert gpt2.style == "gpt" and gpt2.tied and gpt2.d_ff == 4 * 768 and gpt2.context == 1024


@pytest.mark.parametrize(("stem", "total"), CATALOG_CASES)
def test_architectures_stand_in_for_missing_model_type(
        tmp_path: Path, stem: str, total: int) -> None:
    shape = shape_from_hf_config(edited(tmp_path, stem, model_type=...))
    assert count_params(shape).total == total


# --- names and sources ------------------------------------------------------------------


def test_name_defaults_to_file_stem_and_source_names_path() -> None:
    path = DATA / "llama-3-8b.json"
    shape = shape_from_hf_config(str(path))
    assert shape.name == "llama-3-8b"
    assert shape.source == f"Hugging Face config.json at {path}"


def test_name_from_name_or_path_folder_or_argument(tmp_path: Path) -> None:
    stored = edited(tmp_path, "gpt2", _name_or_path="openai-community/gpt2")
    assert shape_from_hf_config(stored).name == "openai-community/gpt2"
    assert shape_from_hf_config(stored, name="mine").name == "mine"
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    assert shape_from_hf_config(write(folder, fixture("llama-3-8b"))).name == "Meta-Llama-3-8B"


# --- family defaults --------------------------------------------------------------------


@pytest.mark.parametrize(("stem", "kv_heads"), [
    ("llama-3-8b", 32),   # LlamaConfig: None -> num_attention_heads
    ("mistral-7b", 8),    # MistralConfig: class default 8, not num_attention_heads
    ("mixtral-8x7b", 8),  # MixtralConfig: class default 8
])
def test_absent_kv_heads_takes_the_class_default(
        tmp_path: Path, stem: str, kv_heads: int) -> None:
    shape = shape_from_hf_config(edited(tmp_path, stem, num_key_value_heads=...))
    assert shape.kv_heads == kv_heads


def test_absent_kv_heads_is_32_for_qwen2(tmp_path: Path) -> None:
    # Qwen2Config's default is a literal 32, whatever num_attention_heads says.
    path = edited(tmp_path, "qwen2.5-7b", num_key_value_heads=..., hidden_size=4096,
                  num_attention_heads=64)
    assert shape_from_hf_config(path).kv_heads == 32
    # With Qwen2.5-7B's 28 heads the default 32 cannot divide them: refused, as
    # transformers' own grouping (28 // 32 == 0) would be broken.
    with pytest.raises(SpecError, match=r"^kv_heads=32: must divide heads"):
        shape_from_hf_config(edited(tmp_path, "qwen2.5-7b", num_key_value_heads=...))


@pytest.mark.parametrize("stem", ["llama-3-8b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b"])
def test_null_kv_heads_means_multi_head(tmp_path: Path, stem: str) -> None:
    shape = shape_from_hf_config(edited(tmp_path, stem, num_key_value_heads=None))
    assert shape.kv_heads == shape.heads


def test_null_head_dim_and_absent_tie_fall_back(tmp_path: Path) -> None:
    shape = shape_from_hf_config(edited(tmp_path, "mistral-nemo-12b", head_dim=None,
                                        tie_word_embeddings=...))
    assert shape.head_dim == 5120 // 32
    assert not shape.tied


def test_gpt2_n_ctx_n_inner_and_tying(tmp_path: Path) -> None:
    shape = shape_from_hf_config(edited(tmp_path, "gpt2", n_positions=..., n_ctx=2048,
                                        n_inner=1000, tie_word_embeddings=False))
    assert (shape.context, shape.d_ff, shape.tied) == (2048, 1000, False)
    assert shape_from_hf_config(edited(tmp_path, "gpt2", n_inner=None)).d_ff == 3072


# --- Qwen3, and a shape back out through hf_config ---------------------------------------


def test_qwen3_reads_its_query_key_norms_and_experts() -> None:
    dense = shape_from_hf_config(DATA / "qwen3-8b.json")
    assert dense.qk_norm and dense.head_dim == 128 and dense.moe is None
    moe = shape_from_hf_config(DATA / "qwen3-235b-a22b.json")
    assert moe.moe == MoE(experts=128, experts_per_token=8, expert_d_ff=1536)
    # By hand, per layer (d=4096, q=64*128=8192, k=v=4*128=512, 128 experts of 1536):
    #   attention 4096*8192*2 + 2*4096*512 = 71,303,168; q/k norms 2*128 = 256
    #   experts 128*3*4096*1536 = 2,415,919,104; router 4096*128 = 524,288; norms 8,192
    # = 2,487,755,008 per layer, x94 = 233,848,970,752; embedding and head 2*151936*4096 =
    # 1,244,659,712; final norm 4,096: 235,093,634,560.
    assert count_params(moe).total == 235_093_634_560


def test_a_moe_shape_round_trips_through_config_json(tmp_path: Path) -> None:
    shape = ModelShape("m", 2, 64, 4, 100, 32, kv_heads=2, d_ff=48, style="llama",
                       tied=True, moe=MoE(8, 2, 48))
    config = hf_config(shape)
    assert (config["model_type"], config["num_local_experts"], config["intermediate_size"]) == (
        "mixtral", 8, 48)
    assert dataclasses.replace(shape_from_hf_config(write(tmp_path, config)), name="m") == shape
