"""A ModelShape as the ``config.json`` transformers builds it from: LlamaForCausalLM
(Qwen2ForCausalLM with q/k/v biases, Qwen3ForCausalLM with query/key norms),
GPT2LMHeadModel, MixtralForCausalLM; shapes that
transformers' classes cannot hold are refused, naming the field (``shardlab export``)."""

from __future__ import annotations

from typing import Any

from shardlab.config.model import LN_EPS, RMS_EPS, ModelShape
from shardlab.errors import SpecError


def hf_family(shape: ModelShape) -> str:
    """``llama``, ``qwen2``, ``qwen3``, ``gpt2``, ``mixtral`` or ``qwen3_moe``: the family a
    shape exports to. Query/key norms (``qk_norm``) export as Qwen3, with experts as
    Qwen3-MoE (each held to Mixtral's limits: every layer MoE, no shared experts, no router
    bias)."""
    if shape.qk_norm:
        if shape.qkv_bias or shape.style != "llama":
            raise SpecError("qk_norm", True, "exports as Qwen3, which is llama style with no "
                            "q/k/v biases")
        if shape.moe is not None:
            _check_mixtral(shape, "Qwen3-MoE")
            return "qwen3_moe"
        return "qwen3"
    if shape.mla is not None:
        raise SpecError("mla", "latent attention", "shardlab's model has no multi-head latent "
                        "attention (DeepSeek): budget and plan price this shape; export and "
                        "import need one without")
    if shape.moe is not None:
        _check_mixtral(shape)
        return "mixtral"
    if shape.style == "llama":
        return "qwen2" if shape.qkv_bias else "llama"
    if shape.kv_heads != shape.heads or shape.head_dim * shape.heads != shape.d_model:
        raise SpecError("kv_heads", shape.kv_heads, "GPT-2 has multi-head attention with "
                        "head_dim = d_model / heads only")
    return "gpt2"


def _check_mixtral(shape: ModelShape, family: str = "Mixtral") -> None:
    """Refuse a MoE shape that transformers' MixtralForCausalLM cannot hold: every layer
    a MoE of ``num_local_experts`` SwiGLU experts, a bias-free router, no shared experts
    (DeepSeek-style shared experts and leading dense layers have no export target)."""
    moe = shape.moe
    assert moe is not None
    if shape.style != "llama":
        raise SpecError("style", shape.style, "must be llama to export a mixture-of-experts "
                        f"model: {family} is RMSNorm, SwiGLU experts, rotary positions")
    refusals = (("qkv_bias", shape.qkv_bias, "no attention biases"),
                ("moe.shared_experts", moe.shared_experts, "no shared experts"),
                ("moe.dense_layers", moe.dense_layers, "a MoE layer in every block"),
                ("moe.router_bias", moe.router_bias, "a router without bias"))
    for field, value, mixtral_has in refusals:
        if value:
            allowed = "false" if isinstance(value, bool) else "0"
            raise SpecError(field, value, f"must be {allowed} to export: transformers' "
                            f"{family} has {mixtral_has}")


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """The ``config.json`` transformers builds the same model from."""
    family = hf_family(shape)
    if family == "gpt2":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "n_embd": shape.d_model, "n_layer": shape.layers, "n_head": shape.heads,
                "n_inner": shape.d_ff, "n_positions": shape.context, "n_ctx": shape.context,
                "vocab_size": shape.vocab, "activation_function": "gelu_pytorch_tanh",
                "layer_norm_epsilon": LN_EPS, "tie_word_embeddings": shape.tied,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "bos_token_id": None, "eos_token_id": None, "dtype": "float32"}
    arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}.get(
        family, "LlamaForCausalLM")
    d_ff = shape.moe.expert_d_ff if shape.moe is not None else shape.d_ff
    config = {"architectures": [arch], "model_type": family,
              "hidden_size": shape.d_model, "intermediate_size": d_ff,
              "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
              "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
              "vocab_size": shape.vocab, "max_position_embeddings": shape.context,
              "rms_norm_eps": RMS_EPS, "hidden_act": "silu",
              # transformers 4.x reads rope_theta, 5.x rope_parameters
              "rope_theta": shape.rope_theta,
              "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
              "tie_word_embeddings": shape.tied, "attention_dropout": 0.0,
              "bos_token_id": None, "eos_token_id": None, "dtype": "float32"}
    if family == "llama":
        config |= {"attention_bias": False, "mlp_bias": False}
    elif family == "qwen2":
        config |= {"use_sliding_window": False}
    elif family == "qwen3":
        config |= {"attention_bias": False, "use_sliding_window": False}
    elif family == "qwen3_moe":
        assert shape.moe is not None
        # norm_topk_prob: the top-k weights renormalised, as shardlab's router does.
        config |= {"attention_bias": False, "use_sliding_window": False,
                   "num_experts": shape.moe.experts,
                   "num_experts_per_tok": shape.moe.experts_per_token,
                   "moe_intermediate_size": shape.moe.expert_d_ff, "norm_topk_prob": True,
                   "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "output_router_logits": False}
    else:
        assert shape.moe is not None
        config |= {"num_local_experts": shape.moe.experts,
                   "num_experts_per_tok": shape.moe.experts_per_token,
                   "sliding_window": None, "router_jitter_noise": 0.0,
                   "output_router_logits": False}
    return config
