"""The memory-bound work of one layer in the step-time model
(:mod:`shardlab.plan.step_time`): the elementwise operators' bytes and the fp8 casts'
seconds, vectorised over layouts. Both move bytes, not FLOPs, and are timed at the
memory bandwidth (roofline: Williams et al. 2009).
"""

from __future__ import annotations

import numpy as np

from shardlab.config.model import ModelShape
from shardlab.estimate import fp8
from shardlab.estimate.fp8 import mean_width
from shardlab.plan.expert_time import kept_rows, routed_tokens
from shardlab.plan.space import Candidates

EAGER_NORM_PASSES = 9
"""An eager torch RMSNorm moves 9x a fused kernel's bytes: x.float() (read 2 B, write 4),
pow (4 + 4), mean (4), x·rsqrt (4 + 4), type_as (4 + 2), ·weight (2 + 2) = 36 B per element
against 4 (read 2, write 2). LayerNorm is one native kernel in eager torch already."""


def layer_elementwise_elements(model: ModelShape, seq: int, tp: np.ndarray, mb: np.ndarray,
                               sp: np.ndarray, flash: bool, fused_norm: bool = True,
                               cp: np.ndarray | int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Elements one layer's memory-bound forward operators read plus write on one tp rank:
    (all of them, the softmax's share). Per operator as
    :func:`shardlab.estimate.operators.layer_operators` counts them (T = b·s tokens): two
    norms 2·T·h each (RMSNorm in eager torch: :data:`EAGER_NORM_PASSES` x that) and two
    residual adds 3·T·h each (divided by t with sequence parallelism, else replicated),
    rotary 2·T·(q + kv)/t (llama style; latent attention 2·T·(heads·rope/t + rope)),
    softmax 2·b·heads·s²/t (none with a fused attention kernel), Qwen3's query/key norms
    2·T·(q + kv)/t (``qk_norm``), latent attention's two latent norms
    2·T·(q_lora + kv_lora) (/t with sequence parallelism, as its down projections),
    activation 3·T·f/t
    (SwiGLU) or 2·T·f/t (GELU), f the MLP width (a MoE layer: its top-k experts' and shared
    widths). A context-parallel rank runs them on
    its T = b·s/cp tokens, the softmax on its s/cp queries against all s keys."""
    m = model
    t = tp.astype(float)
    tokens = mb * seq / np.asarray(cp, float)
    rep = tokens * m.d_model / np.where(sp, t, 1.0)
    llama = m.style == "llama"
    f = mean_width(m)
    soft = 0.0 if flash else 2.0 * tokens * m.heads * seq / t
    if m.mla is not None:  # latent attention rotates each head's rope part and one key
        rope = m.mla.qk_rope_head_dim
        rotary = 2.0 * tokens * (m.heads * rope / t + rope)
    else:
        rotary = 2.0 * tokens * (m.q_dim + m.kv_dim) / t if llama else 0.0
    act = (3.0 if llama else 2.0) * tokens * f / t
    passes = EAGER_NORM_PASSES if llama and not fused_norm else 1
    norms = 4.0 * rep * passes
    if m.qk_norm:  # Qwen3: one RMSNorm per head vector of q and k, on the rank's heads
        norms = norms + 2.0 * tokens * (m.q_dim + m.kv_dim) / t * passes
    elif m.mla is not None:  # the latents' norms run where the down projections do
        latents = m.mla.q_lora_rank + m.mla.kv_lora_rank
        norms = norms + 2.0 * tokens * latents / np.where(sp, t, 1.0) * passes
    total = norms + 6.0 * rep + rotary + soft + act
    return np.asarray(total, float), np.asarray(soft + 0.0 * t, float)


def fp8_cast_seconds(m: ModelShape, c: Candidates, seq: int, bandwidth: float,
                      per_element: int) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one layer's fp8 casts per micro-batch at ``bandwidth``
    (:func:`shardlab.estimate.fp8.cast_bytes`, dense and MoE layers averaged)."""
    w = np.array([fp8.linear_weights(m, int(t), False) for t in c.tp], float)
    tokens = c.micro_batch * seq / c.cp  # a context-parallel rank's tokens
    copies: np.ndarray | float = 1.0
    if m.moe_layers and m.moe is not None:
        w_moe = np.array([fp8.linear_weights(m, int(t), True, int(e), int(et))
                          for t, e, et in zip(c.tp, c.ep, c.etp, strict=True)], float)
        w = ((m.layers - m.moe_layers) * w + m.moe_layers * w_moe) / m.layers
        # Each routed row is quantized for its expert (T·k rows), a shared expert's input once.
        routed = routed_tokens(c, seq)
        moe = kept_rows(m, routed, c.capacity_factor) / routed + bool(m.moe.shared_experts)
        share = m.moe_layers / m.layers
        copies = (1 - share) + share * moe
    fwd, bwd = fp8.cast_bytes(m, tokens, c.tp, c.sp, w, per_element, copies)
    return fwd / bandwidth, bwd / bandwidth


def permute_seconds(m: ModelShape, c: Candidates, seq: int, element_bytes: float,
                    bandwidth: float) -> np.ndarray:
    """Seconds of one layer's token permutation and unpermutation per micro-batch, each of
    forward and backward (averaged over the layers: dense ones have none). Grouped experts
    need each expert's rows contiguous: a fused permute copies every kept assignment from
    the token's row to its expert's slot (R rows of h read and written), the unpermute
    reads them back and writes each token's weighted sum (R read, T written; Megatron-Core
    MoE report, arXiv 2603.07685, Section 4.3.3: "All accumulation is performed in FP32
    precision"), backward the same copies the other way: (3R + T)·h elements each way, R
    the rank's kept rows (:func:`shardlab.plan.expert_time.kept_rows`), T its routed
    tokens, at the memory-bound operators' ``bandwidth``."""
    if m.moe is None or not m.moe_layers:
        return np.zeros(len(c))
    tokens = routed_tokens(c, seq)
    rows = kept_rows(m, tokens, c.capacity_factor)
    elements = (3.0 * rows + tokens) * m.d_model
    return elements * element_bytes / bandwidth * (m.moe_layers / m.layers)


def selective_seconds(core: np.ndarray, m: ModelShape, c: Candidates, seq: int,
                      modules: tuple[str, ...], element_bytes: float,
                      bandwidth: float) -> np.ndarray:
    """Seconds per layer forward that Megatron-Core's selective recompute runs again, each
    layout (averaged over dense and MoE layers): ``core``, the attention core's, when
    ``modules`` is empty (its default) or names ``core_attn``; ``layernorm``: a MoE layer's
    pre-MLP norm (read its input, write its output: 2·T·h elements, /t with sequence
    parallelism; the dense layers' norms are fused into Transformer Engine's linear
    layers and not run again); ``moe_act``: the experts' activation from the first
    matmul's outputs (SwiGLU reads gate and up and writes their product, 3·R·f/etp
    elements; GELU 2·R·f/etp), both at the memory-bound operators' ``bandwidth``
    (:data:`shardlab.estimate.activations.RECOMPUTE_MODULES`)."""
    out = core if not modules or "core_attn" in modules else np.zeros(len(c))
    if m.moe is None or not m.moe_layers:
        return out
    share = m.moe_layers / m.layers
    if "layernorm" in modules:
        tokens = c.micro_batch * seq / c.cp
        out = out + share * 2.0 * tokens * m.d_model / np.where(c.sp, c.tp, 1) * (
            element_bytes / bandwidth)
    if "moe_act" in modules:
        rows = kept_rows(m, routed_tokens(c, seq), c.capacity_factor)
        out = out + share * m.mlp_matrices * rows * m.moe.expert_d_ff / c.etp * (
            element_bytes / bandwidth)
    return out
