"""DeepSeek's config.json families (deepseek_v2, deepseek_v3, kimi_k2) read into a shape
with latent attention and DeepSeek's MoE, and what the reader refuses. The fixtures hold
the fields of the published files (deepseek-ai/DeepSeek-V3, DeepSeek-V2-Lite)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.config.hf_config_support import DATA, edited

from shardlab.config.catalog import get_model
from shardlab.config.hf_config import shape_from_hf_config
from shardlab.config.hf_export import hf_family
from shardlab.config.model import require_buildable
from shardlab.errors import SpecError
from shardlab.estimate.params import count_params


@pytest.mark.parametrize("stem", ["deepseek-v3", "deepseek-v2-lite"])
def test_a_deepseek_config_is_the_catalog_shape(stem: str) -> None:
    shape = shape_from_hf_config(DATA / f"{stem}.json")
    assert shape == get_model(stem) or shape.__dict__ | {"name": stem} == {
        **get_model(stem).__dict__, "source": shape.source}
    assert count_params(shape).total == count_params(get_model(stem)).total


def test_v3_reads_latent_attention_and_its_moe() -> None:
    shape = shape_from_hf_config(DATA / "deepseek-v3.json")
    assert shape.mla is not None and shape.moe is not None
    assert (shape.mla.q_lora_rank, shape.mla.kv_lora_rank, shape.head_dim) == (1536, 512, 192)
    assert (shape.moe.dense_layers, shape.moe.shared_experts, shape.moe.router_bias) == (
        3, 1, True)
    lite = shape_from_hf_config(DATA / "deepseek-v2-lite.json")
    assert lite.mla is not None and lite.mla.q_lora_rank == 0  # null: no query latent
    assert lite.moe is not None and not lite.moe.router_bias  # greedy: no correction bias


@pytest.mark.parametrize(("changes", "field"), [
    ({"num_key_value_heads": 8}, "num_key_value_heads"),
    ({"moe_layer_freq": 2}, "moe_layer_freq"),
    ({"kv_lora_rank": ...}, "kv_lora_rank"),
    ({"qk_rope_head_dim": 0}, "qk_rope_head_dim"),
    ({"kv_lora_rank": 2 ** 31}, "kv_lora_rank"),
    ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
    ({"first_k_dense_replace": -1}, "first_k_dense_replace"),
    ({"first_k_dense_replace": 62}, "first_k_dense_replace"),
    ({"moe_layer_freq": True}, "moe_layer_freq"),
    ({"n_group": 3}, "n_group"), ({"topk_group": 9}, "topk_group"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_bad_deepseek_fields_are_named(tmp_path: Path, changes: dict, field: str) -> None:
    with pytest.raises(SpecError) as e:
        shape_from_hf_config(edited(tmp_path, "deepseek-v3", **changes))
    assert e.value.field == field


def test_the_runtime_and_export_refuse_latent_attention() -> None:
    shape = get_model("deepseek-v2-lite")
    for check in (require_buildable, hf_family):
        with pytest.raises(SpecError, match="latent attention") as e:
            check(shape)
        assert e.value.field == "mla"


@pytest.mark.parametrize("changes", [{"n_routed_experts": None}, {"first_k_dense_replace": 61}])
def test_a_deepseek_config_with_no_moe_layer_is_dense(tmp_path: Path, changes: dict) -> None:
    shape = shape_from_hf_config(edited(tmp_path, "deepseek-v3", **changes))
    assert shape.moe is None and shape.mla is not None and shape.layers == 61


def test_greedy_routing_ignores_the_groups(tmp_path: Path) -> None:
    shape = shape_from_hf_config(edited(tmp_path, "deepseek-v3", topk_method="greedy"))
    assert shape.moe is not None and (shape.moe.groups, shape.moe.group_topk) == (1, 1)
    v3 = shape_from_hf_config(DATA / "deepseek-v3.json")
    assert v3.moe is not None and (v3.moe.groups, v3.moe.group_topk) == (8, 4)
