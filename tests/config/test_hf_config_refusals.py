"""What the Hugging Face config.json importer refuses: missing fields, wrong types, weights
and fields shardlab cannot model, unknown families, unreadable files, MoE shapes that
transformers' Mixtral cannot hold, and what check_computable refuses beyond the shape
(beside the Mixtral values it accepts because they change nothing). Each refusal is a
SpecError that names the field; whatever a field holds, the answer is a shape (or notes)
or a SpecError, never another exception from inside. (What it reads: ``test_hf_config.py``.)
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
from tests.config.hf_config_support import CATALOG_CASES, DATA, edited, fixture, write

from shardlab.config.catalog import get_model
from shardlab.config.hf_config import (
    check_computable,
    rope_theta_of,
    shape_from_hf_config,
)
from shardlab.config.hf_export import hf_config, hf_family
from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError

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


def test_qwen3_exports_as_qwen3_and_qwen3_moe() -> None:
    assert hf_family(get_model("qwen3-8b")) == "qwen3"
    assert hf_family(get_model("qwen3-30b-a3b")) == "qwen3_moe"
    config = hf_config(get_model("qwen3-30b-a3b"))
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["num_experts"], config["num_experts_per_tok"]) == (128, 8)
    assert config["moe_intermediate_size"] == 768 and config["norm_topk_prob"] is True
