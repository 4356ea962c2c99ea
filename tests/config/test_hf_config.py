"""shape_from_hf_config: Hugging Face config.json files into ModelShapes.

The fixtures under data/hf/ copy the published config.json files field for field
(meta-llama/Meta-Llama-3-8B, mistralai/Mistral-7B-v0.1, mistralai/Mixtral-8x7B-v0.1,
Qwen/Qwen2.5-7B, openai-community/gpt2, mistralai/Mistral-Nemo-Base-2407); the
expected totals are the checkpoints' exact parameter counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.hf_config import (
    check_computable,
    rope_theta_of,
    shape_from_hf_config,
)
from shardlab.config.hf_export import hf_config, hf_family
from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError
from shardlab.estimate.params import count_params

DATA = Path(__file__).parent / "data" / "hf"

CATALOG_CASES = [
    ("llama-3-8b", 8_030_261_248),
    ("mistral-7b", 7_241_732_096),
    ("mixtral-8x7b", 46_702_792_704),
    ("qwen2.5-7b", 7_615_616_512),
    # Qwen3: the published files' fields (written out here), q_norm/k_norm included.
    ("qwen3-8b", 8_190_735_360),
    ("qwen3-30b-a3b", 30_532_122_624),
    ("qwen3-235b-a22b", 235_093_634_560),
    ("gpt2", 124_439_808),
]


def fixture(stem: str) -> dict[str, Any]:
    """The parsed fixture ``data/hf/<stem>.json``."""
    return json.loads((DATA / f"{stem}.json").read_text())


def write(tmp_path: Path, config: object, filename: str = "config.json") -> Path:
    """``config`` as JSON in a fresh file under tmp_path."""
    path = tmp_path / filename
    path.write_text(json.dumps(config))
    return path


def edited(tmp_path: Path, stem: str, **changes: object) -> Path:
    """The fixture ``stem`` with ``changes`` applied (a value of ... deletes the key)."""
    config = fixture(stem)
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    return write(tmp_path, config)


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


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(("stem", "field"), [
    ("llama-3-8b", "hidden_size"),
    ("mistral-7b", "intermediate_size"),
    ("mixtral-8x7b", "num_local_experts"),
    ("mixtral-8x7b", "num_experts_per_tok"),
    ("qwen2.5-7b", "max_position_embeddings"),
    ("gpt2", "n_embd"),
    ("gpt2", "vocab_size"),
])
def test_missing_field_is_named(tmp_path: Path, stem: str, field: str) -> None:
    with pytest.raises(SpecError, match=rf"^{field}=None: is missing") as err:
        shape_from_hf_config(edited(tmp_path, stem, **{field: ...}))
    assert err.value.field == field


def test_gpt2_without_any_position_size(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^n_positions=None: is missing"):
        shape_from_hf_config(edited(tmp_path, "gpt2", n_positions=..., n_ctx=...))


@pytest.mark.parametrize("value", ["4096", 4096.0, True, 0, -1, [4096], None])
def test_wrong_type_is_named(tmp_path: Path, value: object) -> None:
    with pytest.raises(SpecError, match=r"^hidden_size=.*must be a positive integer"):
        shape_from_hf_config(edited(tmp_path, "llama-3-8b", hidden_size=value))


def test_non_boolean_flag_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^tie_word_embeddings='no': must be true or false"):
        shape_from_hf_config(edited(tmp_path, "qwen2.5-7b", tie_word_embeddings="no"))


@pytest.mark.parametrize(("stem", "field"), [
    ("llama-3-8b", "attention_bias"),
    ("llama-3-8b", "mlp_bias"),
    ("gpt2", "add_cross_attention"),
])
def test_weights_shardlab_cannot_model_are_refused(
        tmp_path: Path, stem: str, field: str) -> None:
    with pytest.raises(SpecError, match=rf"^{field}=True: is not supported"):
        shape_from_hf_config(edited(tmp_path, stem, **{field: True}))


def test_too_many_experts_per_token(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^num_experts_per_tok=9: must be <= num_local"):
        shape_from_hf_config(edited(tmp_path, "mixtral-8x7b", num_experts_per_tok=9))


@pytest.mark.parametrize(("changes", "named"), [
    ({"sliding_window": 4096}, "sliding_window=4096: must be null (or at least "
                               "max_position_embeddings, 32768)"),
    ({"sliding_window": "4096"}, "sliding_window='4096': must be null"),
    ({"router_jitter_noise": 0.01}, "router_jitter_noise=0.01: must be 0"),
    ({"router_jitter_noise": None}, "router_jitter_noise=None: must be 0"),
    ({"output_router_logits": True}, "output_router_logits=True: must be false"),
])
def test_mixtral_fields_shardlab_does_not_model(tmp_path: Path, changes: dict[str, object],
                                                named: str) -> None:
    with pytest.raises(SpecError, match="^" + re.escape(named)):
        shape_from_hf_config(edited(tmp_path, "mixtral-8x7b", **changes))


def test_mixtral_fields_that_change_nothing(tmp_path: Path) -> None:
    # A window no sequence can exceed, zero noise, and a coefficient that is unused while
    # output_router_logits is false.
    shape = shape_from_hf_config(edited(tmp_path, "mixtral-8x7b", sliding_window=32768,
                                        router_jitter_noise=0, router_aux_loss_coef=0.5))
    assert shape == shape_from_hf_config(DATA / "mixtral-8x7b.json", name=shape.name)


def test_a_moe_shape_round_trips_through_config_json(tmp_path: Path) -> None:
    shape = ModelShape("m", 2, 64, 4, 100, 32, kv_heads=2, d_ff=48, style="llama",
                       tied=True, moe=MoE(8, 2, 48))
    config = hf_config(shape)
    assert (config["model_type"], config["num_local_experts"], config["intermediate_size"]) == (
        "mixtral", 8, 48)
    assert dataclasses.replace(shape_from_hf_config(write(tmp_path, config)), name="m") == shape


@pytest.mark.parametrize(("shape", "named"), [
    (ModelShape("m", 2, 64, 4, 100, 32, moe=MoE(8, 2, 48)), "style='gpt': must be llama"),
    (ModelShape("m", 2, 64, 4, 100, 32, style="llama", qkv_bias=True, moe=MoE(8, 2, 48)),
     "qkv_bias=True: must be false to export: transformers' Mixtral has no attention"),
    (ModelShape("m", 2, 64, 4, 100, 32, style="llama", moe=MoE(8, 2, 48, shared_experts=2)),
     "moe.shared_experts=2: must be 0 to export: transformers' Mixtral has no shared"),
    (ModelShape("m", 2, 64, 4, 100, 32, style="llama", moe=MoE(8, 2, 48, dense_layers=1)),
     "moe.dense_layers=1: must be 0 to export"),
    (ModelShape("m", 2, 64, 4, 100, 32, style="llama", moe=MoE(8, 2, 48, router_bias=True)),
     "moe.router_bias=True: must be false to export"),
])
def test_moe_shapes_mixtral_cannot_hold_are_refused(shape: ModelShape, named: str) -> None:
    with pytest.raises(SpecError, match="^" + re.escape(named)):
        hf_family(shape)


@pytest.mark.parametrize("model_type", ["qwen2_moe", "bert", "", None, 3])
def test_unknown_model_type(tmp_path: Path, model_type: object) -> None:
    with pytest.raises(SpecError, match=r"^model_type=.*must be one of llama, mistral, mixtral, "
                                        "qwen2, qwen3, qwen3_moe, gpt2"):
        shape_from_hf_config(edited(tmp_path, "llama-3-8b", model_type=model_type))


@pytest.mark.parametrize("architectures", [..., [], ["BertModel"], "LlamaForCausalLM", [7]])
def test_no_model_type_and_no_known_architecture(tmp_path: Path, architectures: object) -> None:
    path = edited(tmp_path, "llama-3-8b", model_type=..., architectures=architectures)
    with pytest.raises(SpecError, match=r"^model_type=None: is missing, and architectures"):
        shape_from_hf_config(path)


@pytest.mark.parametrize(("text", "reason"), [
    ("{not json", "is not valid JSON"),
    ("", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object at the top level, not list"),
    ("null", "not NoneType"),
])
def test_bad_file_content(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=rf"^config=.*{reason}") as err:
        shape_from_hf_config(path)
    assert err.value.value == str(path)


def test_bad_bytes_missing_file_and_directory(tmp_path: Path) -> None:
    binary = tmp_path / "config.json"
    binary.write_bytes(b"\xff\xfe\x00{")
    with pytest.raises(SpecError, match=r"^config=.*is not UTF-8 text"):
        shape_from_hf_config(binary)
    with pytest.raises(SpecError, match=r"^config=.*cannot be read"):
        shape_from_hf_config(tmp_path / "absent.json")
    with pytest.raises(SpecError, match=r"^config=.*must be a regular file"):
        shape_from_hf_config(tmp_path)
    with pytest.raises(SpecError, match=r"^config='/dev/zero'.*must be a regular file"):
        shape_from_hf_config("/dev/zero")


JUNK: list[object] = [None, True, 0, -3, 2.5, "8", [], {}, 10**6]


@pytest.mark.parametrize("stem", [stem for stem, _ in CATALOG_CASES] + ["mistral-nemo-12b"])
def test_any_junk_value_gives_a_shape_or_a_spec_error(tmp_path: Path, stem: str) -> None:
    # Whatever a field holds, the importer answers with a shape or a SpecError, never a
    # KeyError/TypeError/ZeroDivisionError from inside.
    config = fixture(stem)
    for key in [*config, "head_dim", "num_key_value_heads", "n_inner"]:
        for junk in JUNK:
            path = write(tmp_path, {**config, key: junk})
            with contextlib.suppress(SpecError):
                shape_from_hf_config(path)


# --- check_computable: what import refuses beyond the shape ------------------------------

@pytest.mark.parametrize(("stem", "outcome"), [
    ("gpt2", []),  # gelu_new is the tanh GELU shardlab computes; eps 1e-5 is LayerNorm's
    ("mistral-7b", ["norm eps 1e-05 in config.json, shardlab's model uses 1e-06: logits "
                    "differ slightly"]),
    # Their rotary bases (500 000 and 1 000 000) are the shape's own: computable.
    ("llama-3-8b", ["norm eps 1e-05 in config.json, shardlab's model uses 1e-06: logits "
                    "differ slightly"]),
    ("qwen2.5-7b", []),
])
def test_published_configs_computable_or_not(stem: str, outcome: list[str]) -> None:
    config = fixture(stem)
    style = "gpt" if stem == "gpt2" else "llama"
    assert check_computable(config, style) == outcome


@pytest.mark.parametrize(("stem", "theta"), [("llama-3-8b", 500_000.0), ("qwen2.5-7b", 1e6),
                                             ("mistral-7b", 10_000.0)])
def test_the_rotary_base_is_the_shape_s(stem: str, theta: float) -> None:
    assert rope_theta_of(fixture(stem)) == theta
    assert get_model(stem).rope_theta == theta  # the catalog agrees with the file
    with pytest.raises(SpecError, match=r"^rope_parameters\.rope_theta=3\.0: must equal"):
        rope_theta_of({"rope_theta": theta, "rope_parameters": {"rope_theta": 3.0}})


@pytest.mark.parametrize(("edits", "field"), [
    ({"activation_function": "relu"}, "activation_function='relu'"),
    ({"activation_function": "gelu"}, "activation_function='gelu'"),  # exact erf GELU
    ({"layer_norm_epsilon": -1.0}, "layer_norm_epsilon=-1.0"),
])
def test_gpt2_activation_and_eps(edits: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError, match=f"^{field}: must be"):
        check_computable(fixture("gpt2") | edits, "gpt")


@pytest.mark.parametrize(("stem", "style"), [("mistral-7b", "llama"), ("gpt2", "gpt")])
def test_any_junk_value_gives_notes_or_a_spec_error(stem: str, style: str) -> None:
    # Whatever a field holds, check_computable answers with notes or a SpecError, never a
    # TypeError/ValueError/AttributeError from inside (rope_theta "abc", rope_scaling "x").
    config = fixture(stem)
    extra = ["rope_parameters", "rope_scaling", "hidden_act", "activation_function"]
    for key in [*config, *extra]:
        for junk in [*JUNK, "abc", float("nan"), float("inf"), {"rope_type": [1]},
                     {"type": None}, {"rope_theta": "x"}]:
            with contextlib.suppress(SpecError):
                assert isinstance(check_computable({**config, key: junk}, style), list)


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


@pytest.mark.parametrize(("changes", "named"), [
    ({"head_dim": ...}, "head_dim=None: is missing"),
    ({"num_key_value_heads": ...}, "num_key_value_heads=None: is missing"),
    ({"attention_bias": True}, "attention_bias=True: is not supported"),
    ({"use_sliding_window": True}, "use_sliding_window=True: is not supported"),
    ({"mlp_only_layers": [0, 1]}, "mlp_only_layers=[0, 1]: must be empty"),
    ({"decoder_sparse_step": 2}, "decoder_sparse_step=2: must be 1"),
    ({"num_experts_per_tok": 200}, "num_experts_per_tok=200: must be <= num_experts (128)"),
])
def test_qwen3_fields_shardlab_cannot_hold_are_refused(tmp_path: Path, changes: dict,
                                                       named: str) -> None:
    with pytest.raises(SpecError, match="^" + re.escape(named)):
        shape_from_hf_config(edited(tmp_path, "qwen3-30b-a3b", **changes))


def test_a_qwen3_shape_exports_nothing() -> None:
    with pytest.raises(SpecError, match=r"^qk_norm=True: shardlab's model has no query/key"):
        hf_family(get_model("qwen3-8b"))
