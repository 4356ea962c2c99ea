"""The model catalog: exact parameter counts of the released checkpoints, and loose lookup."""

import math

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
    # DeepSeek's family: the sum of the tensors DeepseekV3ForCausalLM builds from each
    # config.json (test_deepseek_tensors_from_config), MTP layers excluded.
    "deepseek-v2-lite": 15_706_484_224,
    "deepseek-v3": 671_026_419_200,
    "kimi-k2": 1_026_408_232_448,
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


def deepseek_tensors(c: dict[str, int]) -> int:
    """numel summed over the tensors of a DeepSeek-V2/V3 checkpoint (``modeling_deepseek.py``
    names), built one by one from its config.json fields: an independent count."""
    h, heads, rope = c["hidden_size"], c["num_attention_heads"], c["qk_rope_head_dim"]
    qk = c["qk_nope_head_dim"] + rope
    q_lora, kv_lora = c["q_lora_rank"], c["kv_lora_rank"]
    if q_lora:
        query = {"q_a_proj": (q_lora, h), "q_a_layernorm": (q_lora,),
                 "q_b_proj": (heads * qk, q_lora)}
    else:
        query = {"q_proj": (heads * qk, h)}
    attn = {**query, "kv_a_proj_with_mqa": (kv_lora + rope, h), "kv_a_layernorm": (kv_lora,),
            "kv_b_proj": (heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), kv_lora),
            "o_proj": (h, heads * c["v_head_dim"]), "input_layernorm": (h,),
            "post_attention_layernorm": (h,)}

    def mlp(width: int) -> list[tuple[int, ...]]:
        return [(width, h), (width, h), (h, width)]  # gate, up, down

    dense = mlp(c["intermediate_size"])
    moe = (mlp(c["moe_intermediate_size"]) * c["n_routed_experts"]
           + mlp(c["moe_intermediate_size"] * c["n_shared_experts"])
           + [(c["n_routed_experts"], h)]  # gate.weight
           + ([(c["n_routed_experts"],)] if c["noaux_tc"] else []))  # e_score_correction_bias
    k = c["first_k_dense_replace"]
    shapes = (list(attn.values()) * c["num_hidden_layers"] + dense * k
              + moe * (c["num_hidden_layers"] - k)
              + [(c["vocab_size"], h), (h,), (c["vocab_size"], h)])  # embed, norm, lm_head
    return sum(math.prod(s) for s in shapes)


_V3 = {"hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64,
       "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
       "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
       "n_shared_experts": 1, "noaux_tc": 1, "first_k_dense_replace": 3,
       "num_hidden_layers": 61, "vocab_size": 129280}
DEEPSEEK_CONFIGS = {
    "deepseek-v3": _V3,
    "kimi-k2": {**_V3, "num_attention_heads": 64, "n_routed_experts": 384,
                "first_k_dense_replace": 1, "vocab_size": 163840},
    "deepseek-v2-lite": {**_V3, "hidden_size": 2048, "num_attention_heads": 16,
                         "q_lora_rank": 0, "intermediate_size": 10944,
                         "moe_intermediate_size": 1408, "n_routed_experts": 64,
                         "n_shared_experts": 2, "noaux_tc": 0, "first_k_dense_replace": 1,
                         "num_hidden_layers": 27, "vocab_size": 102400},
}


@pytest.mark.parametrize("name", sorted(DEEPSEEK_CONFIGS))
def test_deepseek_tensors_from_config(name: str) -> None:
    assert count_params(MODELS[name]).total == deepseek_tensors(DEEPSEEK_CONFIGS[name])


@pytest.mark.parametrize(("name", "total", "unit", "active_b"), [
    # DeepSeek-V3 report (arXiv 2412.19437), abstract: "671B total parameters with 37B
    # activated for each token"; Kimi K2's model card: 1T total, 32B activated;
    # DeepSeek-V2 (arXiv 2405.04434), DeepSeek-V2-Lite: "15.7B parameters in total".
    ("deepseek-v3", 671, 1e9, 37), ("kimi-k2", 1, 1e12, 32),
    ("deepseek-v2-lite", 157, 1e8, None),
])
def test_deepseek_published_sizes(name: str, total: int, unit: float,
                                  active_b: int | None) -> None:
    c = count_params(MODELS[name])
    assert round(c.total / unit) == total
    if active_b is not None:  # activated: without the input embedding (a lookup)
        assert round((c.active_per_token - c.embedding) / 1e9) == active_b


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
