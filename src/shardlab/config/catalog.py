"""Public model shapes, each with the source of its numbers.

Every entry's parameter count is checked in the tests against the published
checkpoint's exact count (the sum of ``numel`` over its tensors).
"""

from __future__ import annotations

from shardlab.config.lookup import find
from shardlab.config.model import MLA, ModelShape, MoE

_GPT2 = "OpenAI GPT-2 (Radford et al. 2019), Hugging Face config.json of openai-community/{}"
_HF = "Hugging Face config.json of {}"


def _gpt2(name: str, repo: str, layers: int, d: int, heads: int) -> ModelShape:
    return ModelShape(name, layers, d, heads, vocab=50257, context=1024, style="gpt",
                      tied=True, source=_GPT2.format(repo))


def _llama(name: str, repo: str, layers: int, d: int, heads: int, kv: int, ff: int,
           vocab: int, ctx: int, **extra: object) -> ModelShape:
    return ModelShape(name, layers, d, heads, vocab=vocab, context=ctx, kv_heads=kv, d_ff=ff,
                      style="llama", tied=False, source=_HF.format(repo), **extra)  # type: ignore[arg-type]


_MLA_V3 = MLA(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
              q_lora_rank=1536)
"""DeepSeek-V3's latent attention (its config.json), which Kimi K2 shares."""

MODELS: dict[str, ModelShape] = {m.name: m for m in (
    _gpt2("gpt2", "gpt2", 12, 768, 12),
    _gpt2("gpt2-medium", "gpt2-medium", 24, 1024, 16),
    _gpt2("gpt2-large", "gpt2-large", 36, 1280, 20),
    _gpt2("gpt2-xl", "gpt2-xl", 48, 1600, 25),
    ModelShape("gpt3-175b", 96, 12288, 96, vocab=50257, context=2048, style="gpt", tied=True,
               source="Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1"),
    _llama("llama-2-7b", "meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 11008, 32000, 4096),
    _llama("llama-2-13b", "meta-llama/Llama-2-13b-hf", 40, 5120, 40, 40, 13824, 32000, 4096),
    _llama("llama-2-70b", "meta-llama/Llama-2-70b-hf", 80, 8192, 64, 8, 28672, 32000, 4096),
    _llama("llama-3-8b", "meta-llama/Meta-Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, 8192,
           rope_theta=500_000.0),
    _llama("llama-3-70b", "meta-llama/Meta-Llama-3-70B", 80, 8192, 64, 8, 28672, 128256, 8192,
           rope_theta=500_000.0),
    _llama("llama-3.1-405b", "meta-llama/Llama-3.1-405B", 126, 16384, 128, 8, 53248, 128256,
           131072, rope_theta=500_000.0),
    _llama("mistral-7b", "mistralai/Mistral-7B-v0.1", 32, 4096, 32, 8, 14336, 32000, 32768),
    _llama("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 32, 4096, 32, 8, 14336, 32000, 32768,
           moe=MoE(experts=8, experts_per_token=2, expert_d_ff=14336), rope_theta=1e6),
    _llama("qwen2.5-7b", "Qwen/Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064, 131072,
           qkv_bias=True, rope_theta=1e6),
    # Qwen3: head_dim 128 whatever the width, RMSNorm on each head's query and key.
    _llama("qwen3-8b", "Qwen/Qwen3-8B", 36, 4096, 32, 8, 12288, 151936, 40960,
           head_dim=128, qk_norm=True, rope_theta=1e6),
    _llama("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 48, 2048, 32, 4, 6144, 151936, 40960,
           head_dim=128, qk_norm=True, rope_theta=1e6,
           moe=MoE(experts=128, experts_per_token=8, expert_d_ff=768)),
    _llama("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", 94, 4096, 64, 4, 12288, 151936, 40960,
           head_dim=128, qk_norm=True, rope_theta=1e6,
           moe=MoE(experts=128, experts_per_token=8, expert_d_ff=1536)),
    # DeepSeek's latent attention (mla) and MoE: dense first layers, shared experts, and
    # (noaux_tc routing) a per-expert correction bias in every router.
    _llama("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", 27, 2048, 16, 16, 10944,
           102400, 163840, mla=MLA(512, 128, 64, 128),
           moe=MoE(experts=64, experts_per_token=6, expert_d_ff=1408, shared_experts=2,
                   dense_layers=1)),
    _llama("deepseek-v3", "deepseek-ai/DeepSeek-V3", 61, 7168, 128, 128, 18432, 129280,
           163840, mla=_MLA_V3,
           moe=MoE(experts=256, experts_per_token=8, expert_d_ff=2048, shared_experts=1,
                   router_bias=True, dense_layers=3, groups=8, group_topk=4)),
    _llama("kimi-k2", "moonshotai/Kimi-K2-Base", 61, 7168, 64, 64, 18432, 163840, 131072,
           mla=_MLA_V3, rope_theta=50_000.0,
           moe=MoE(experts=384, experts_per_token=8, expert_d_ff=2048, shared_experts=1,
                   router_bias=True, dense_layers=1)),
    ModelShape("hypo-100b", 80, 10240, 80, vocab=50257, context=2048, style="gpt", tied=True,
               source="the seed calculator's hypothetical GPT-3-style 100B model "
                      "(80 layers, d=10240, 80 heads of 128, GPT-2 BPE vocabulary)"),
)}

ALIASES: dict[str, tuple[str, ...]] = {
    "gpt2": ("gpt2-small", "gpt-2", "gpt2-124m"),
    "gpt3-175b": ("gpt3", "gpt-3", "davinci"),
    "llama-3-8b": ("meta-llama-3-8b", "llama3-8b"),
    "llama-3-70b": ("meta-llama-3-70b", "llama3-70b"),
    "llama-3.1-405b": ("llama-405b",),
    "qwen3-30b-a3b": ("qwen3-30b",),
    "qwen3-235b-a22b": ("qwen3-235b",),
    "deepseek-v3": ("dsv3", "deepseek-v3-671b", "deepseek-r1"),
    "deepseek-v2-lite": ("dsv2-lite",),
    "kimi-k2": ("kimi-k2-1t",),
    "hypo-100b": ("100b", "hypothetical-100b"),
}


def get_model(name: str) -> ModelShape:
    """The catalog entry ``name`` names (loose match, see :mod:`shardlab.config.lookup`)."""
    return find("model", name, MODELS, ALIASES)
