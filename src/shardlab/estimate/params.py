"""Exact parameter counts of a ModelShape, part by part.

Per layer (d = d_model, q = heads*head_dim, k = kv_heads*head_dim, f = d_ff):

* attention: Q d*q, K and V d*k each, output q*d; gpt style adds the biases
  q + 2k + d, ``qkv_bias`` adds q + 2k, ``qk_norm`` two RMSNorm scales of head_dim.
  Latent attention (``mla``): the sum of its linear layers' weights
  (:attr:`~shardlab.config.model.ModelShape.attention_linears`) and the RMSNorm scales of
  its latents, q_lora_rank + kv_lora_rank (DeepSeek-V3: 187,107,328 a layer).
* dense MLP: gpt 2*d*f + f + d (GELU, biases); llama 3*d*f (SwiGLU, no biases).
* norms: two per layer plus a final one; LayerNorm 2d each, RMSNorm d each.
* MoE layer: ``experts`` routed MLPs of width expert_d_ff, one shared MLP of width
  shared_experts x shared_d_ff, and a router d*experts (+ experts with ``router_bias``).
* embedding V*d; gpt style adds learned positions context*d; an untied head
  adds V*d.

With kv_heads = heads and f = 4d a gpt layer is 12d² + 13d: the "N ≈ 12·L·d²" rule
(Kaplan et al. 2020; the seed calculator). These are the counts of the released
checkpoints (tested: Llama-3-8B 8,030,261,248; GPT-3 175B 174,604,259,328).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.config.model import ModelShape


def attention_params(m: ModelShape) -> int:
    """Parameters of one attention block: Q, K, V, output projections and their biases
    (latent attention: its down and up projections and its latents' norms)."""
    n = m.attention_weights + latent_norm_params(m)
    if m.biases:
        n += m.q_dim + 2 * m.kv_dim + m.d_model
    elif m.qkv_bias:
        n += m.q_dim + 2 * m.kv_dim
    return n + qk_norm_params(m)


def qk_norm_params(m: ModelShape) -> int:
    """The query and key norms' scales of one layer (Qwen3's q_norm, k_norm): 2·head_dim,
    the same on every head and every tensor-parallel rank; 0 without ``qk_norm``."""
    return 2 * m.head_dim if m.qk_norm else 0


def latent_norm_params(m: ModelShape) -> int:
    """The RMSNorm scales of latent attention's latents (DeepSeek's ``q_a_layernorm``,
    ``kv_a_layernorm``): q_lora_rank + kv_lora_rank; 0 without latent attention."""
    return 0 if m.mla is None else m.mla.q_lora_rank + m.mla.kv_lora_rank


def duplicated_attention_params(m: ModelShape) -> int:
    """Attention parameters every tensor-parallel rank holds whole: the query/key norms,
    and latent attention's down projections and latent norms (module docstring)."""
    return (qk_norm_params(m) + latent_norm_params(m)
            + sum(x.d_in * x.d_out for x in m.attention_linears if x.split == "duplicated"))


def mlp_params(m: ModelShape, d_ff: int) -> int:
    """Parameters of one dense MLP of hidden width ``d_ff`` (GELU+biases or SwiGLU)."""
    n = m.mlp_matrices * m.d_model * d_ff
    if m.biases:
        n += d_ff + m.d_model
    return n


def norm_params(m: ModelShape) -> int:
    """Parameters of one norm: LayerNorm has scale and shift (2d), RMSNorm a scale (d)."""
    return 2 * m.d_model if m.style == "gpt" else m.d_model


def router_params(m: ModelShape) -> int:
    """Parameters of one MoE router: a d_model x experts linear layer (0 for dense models)."""
    if m.moe is None:
        return 0
    return m.d_model * m.moe.experts + (m.moe.experts if m.moe.router_bias else 0)


def shared_expert_params(m: ModelShape) -> int:
    """Parameters of one MoE layer's shared experts: one MLP of width shared_experts x
    shared_d_ff, the same function as the separate experts summed, as DeepSeek-V2's code
    and shardlab's model build them (one down-projection bias with biases); 0 without."""
    if m.moe is None or not m.moe.shared_experts:
        return 0
    return mlp_params(m, m.moe.shared_experts * m.moe.shared_d_ff)


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts by part, summed over all layers."""

    attention: int
    mlp: int
    experts: int
    router: int
    norms: int
    embedding: int
    position: int
    head: int
    active_experts: int
    mtp: int = 0
    """Multi-token prediction beyond its layers (counted with the others): each depth's
    projection and norms (:func:`mtp_params`)."""

    @property
    def total(self) -> int:
        """Every parameter of the checkpoint."""
        return (self.attention + self.mlp + self.experts + self.router + self.norms
                + self.embedding + self.position + self.head + self.mtp)

    @property
    def active_per_token(self) -> int:
        """Parameters one token passes through: routed experts only for its top-k."""
        return self.total - self.experts + self.active_experts

    @property
    def non_embedding(self) -> int:
        """Total less the embedding, position table and untied head (Kaplan et al. 2020's N)."""
        return self.total - self.embedding - self.position - self.head

    def as_dict(self) -> dict[str, int]:
        """Parts plus ``total``, ``active_per_token`` and ``non_embedding``."""
        return {"total": self.total, "active_per_token": self.active_per_token,
                "non_embedding": self.non_embedding, "attention": self.attention,
                "mlp": self.mlp, "experts": self.experts, "router": self.router,
                "norms": self.norms, "embedding": self.embedding, "position": self.position,
                "head": self.head, "mtp": self.mtp}


def count_params(m: ModelShape) -> ParamCount:
    """Exact parameter count of ``m``, broken down by part."""
    experts = active = 0
    if m.moe is not None:
        e = m.moe
        shared = shared_expert_params(m)
        experts = m.moe_layers * (e.experts * mlp_params(m, e.expert_d_ff) + shared)
        active = m.moe_layers * (e.experts_per_token * mlp_params(m, e.expert_d_ff) + shared)
    return ParamCount(
        attention=m.layers * attention_params(m),
        mlp=m.dense_layers * mlp_params(m, m.d_ff),
        experts=experts,
        router=m.moe_layers * router_params(m),
        norms=(2 * m.layers + 1) * norm_params(m),
        embedding=m.vocab * m.d_model,
        position=m.context * m.d_model if m.style == "gpt" else 0,
        head=0 if m.tied else m.vocab * m.d_model,
        active_experts=active,
        mtp=m.mtp_layers * mtp_params(m),
    )


def mtp_params(m: ModelShape) -> int:
    """One multi-token-prediction depth's parameters beyond its transformer layer: the
    projection of its two normed inputs, 2·d_model x d_model, and three norms (of the
    hidden state, of the next token's embedding, and its final one): Megatron-Core's
    ``MultiTokenPredictionLayer`` (``eh_proj``, ``hnorm``, ``enorm``,
    ``final_layernorm``); DeepSeek-V3 Sec. 2.2's M_k and RMSNorms."""
    return 2 * m.d_model * m.d_model + 3 * norm_params(m)
