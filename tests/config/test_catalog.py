"""The model catalog: exact parameter counts of the released checkpoints, and loose lookup."""

import pytest

from shardlab.config.catalog import MODELS, get_model
from shardlab.errors import SpecError
from shardlab.estimate.params import count_params

# Sum of numel over the tensors of each released checkpoint (Hugging Face model cards /
# safetensors index metadata); GPT-3 and the hypothetical 100B from their published shapes.
PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "gpt3-175b": 174_604_259_328,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    # Qwen3 safetensors index totals / 2 (bf16): with the q_norm and k_norm scales.
    "qwen3-8b": 8_190_735_360,
    "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-235b-a22b": 235_093_634_560,
    "hypo-100b": 101_209_569_280,
}


def test_every_catalog_model_has_a_published_count_and_a_source() -> None:
    assert set(MODELS) == set(PUBLISHED)
    for m in MODELS.values():
        assert m.source, m.name


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_exact_parameter_count(name: str) -> None:
    assert count_params(MODELS[name]).total == PUBLISHED[name]


def test_mixtral_active_parameters() -> None:
    # Two of eight experts per token: Mistral AI quotes 12.9B active of 46.7B.
    c = count_params(get_model("mixtral-8x7b"))
    assert c.active_per_token == 12_879_925_248
    assert c.router == 32 * 4096 * 8


def test_gpt_layer_is_12d2_plus_13d() -> None:
    m = get_model("gpt3-175b")
    c = count_params(m)
    d = m.d_model
    per_layer = (c.attention + c.mlp + c.norms - 2 * d) // m.layers
    assert per_layer == 12 * d * d + 13 * d


@pytest.mark.parametrize(("query", "name"), [
    ("Llama-3 8B", "llama-3-8b"), ("LLAMA_3_8B", "llama-3-8b"), ("gpt2-small", "gpt2"),
    ("mixtral", "mixtral-8x7b"), ("GPT-3", "gpt3-175b"), ("llama-3.1-405B", "llama-3.1-405b"),
])
def test_loose_lookup(query: str, name: str) -> None:
    assert get_model(query).name == name


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(SpecError, match="llama-3-8b"):
        get_model("llama-3-9b")


def test_ambiguous_model_lists_candidates() -> None:
    with pytest.raises(SpecError, match="ambiguous"):
        get_model("llama-2")
