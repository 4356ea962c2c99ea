"""Floating-point operations of a transformer LM, per token and per training run.

Conventions (state them: tools differ):

* A matmul [1, m] x [m, n] costs 2mn FLOPs (one multiply, one add). Only matmuls
  are counted: norms, activations, softmax and biases are left out, as in
  Korthikanti et al. 2022 and Narayanan et al. 2021.
* Logits are counted (the head's 2·d·V per token); the embedding lookup is not a
  matmul and costs nothing.
* Attention scores and the weighted sum of values cost 4·s·(heads·head_dim) per
  token and layer with the full s×s matrix (Megatron, PaLM, the seed calculator);
  ``causal=True`` halves it (only the lower triangle is needed: FlashAttention's
  convention). With latent attention the scores run at the query/key head width and
  the sum at the value's: 2·s·heads·(qk_head_dim + v_head_dim) (each score a dot product
  of nope + rope terms, each output a sum over s values of v_head_dim: DeepSeek-V2, arXiv
  2405.04434, Eq. 10-18, the training form with K and V decompressed); its down and up
  projections are matmuls like any other.
* Training = forward + backward, backward = 2x forward (input and weight
  gradients), so 3x forward: these are *model* FLOPs, the ones MFU divides by.
  *Hardware* FLOPs add what recompute runs again: selective recompute one more
  forward of the attention core, full recompute one more forward of every
  transformer layer (not the head). HFU divides by these (PaLM, Chowdhery 2022).
  A fused attention kernel (``flash=True``) recomputes Q·Kᵀ in its backward (Dao et
  al. 2022, FlashAttention-2 Alg. 2): half the attention core's forward again.
  torchtitan's per-operator checkpointing (``op``) runs again the linear matmuls whose
  outputs it does not save (:func:`shardlab.estimate.activations.op_checkpoint_saves`:
  k, output and up of a Llama block), not the attention kernel, whose output it saves.

For a gpt-style model with kv_heads = heads and d_ff = 4h this gives, for a batch
of B sequences, exactly Korthikanti et al. 2022 (arXiv 2205.05198) Eq. 7,
72·B·L·s·h²·(1 + s/(6h) + V/(12hL)), and with full recompute Narayanan et al.
2021's 96·B·s·L·h²·(1 + s/(6h) + V/(16Lh)) (both checked in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.config.model import ModelShape
from shardlab.estimate.activations import op_checkpoint_saves


def layer_matmul_weights(m: ModelShape, moe_layer: bool) -> int:
    """Weights one token multiplies through in one layer: attention, MLP (top-k experts), router."""
    attn = m.attention_weights
    if not moe_layer or m.moe is None:
        return attn + m.mlp_matrices * m.d_model * m.d_ff
    e = m.moe
    widths = e.experts_per_token * e.expert_d_ff + e.shared_experts * e.shared_d_ff
    return attn + m.mlp_matrices * m.d_model * widths + m.d_model * e.experts


def matmul_weights_per_token(m: ModelShape) -> int:
    """Weights one token multiplies through in the whole model, the output head included."""
    # A multi-token-prediction depth (one of the layers) adds its projection (2h x h) and
    # one more pass through the head (DeepSeek-V3 Sec. 2.2).
    return (m.dense_layers * layer_matmul_weights(m, False)
            + m.moe_layers * layer_matmul_weights(m, True) + m.vocab * m.d_model
            + m.mtp_layers * (2 * m.d_model * m.d_model + m.vocab * m.d_model))


def attention_core_flops_per_token(m: ModelShape, seq: int, causal: bool = False) -> float:
    """Forward FLOPs of Q·Kᵀ and scores·V per token, all layers: 2·L·s·(q_dim + o_dim),
    4·L·s·q_dim without latent attention (halved if causal)."""
    keys = seq / 2 if causal else seq
    return 2.0 * m.layers * keys * (m.q_dim + m.o_dim)


@dataclass(frozen=True)
class FlopsPerToken:
    """FLOPs per trained token at sequence length ``seq``."""

    forward: float
    attention: float
    logits: float
    train: float
    hardware_train: float


def flops_per_token(m: ModelShape, seq: int, recompute: str = "none",
                    causal: bool = False, flash: bool = False) -> FlopsPerToken:
    """Forward, training (model) and training-with-recompute (hardware) FLOPs per token."""
    attn = attention_core_flops_per_token(m, seq, causal)
    logits = 2.0 * m.vocab * m.d_model
    forward = 2.0 * matmul_weights_per_token(m) + attn
    train = 3.0 * forward
    if recompute == "none":
        extra = attn / 2 if flash else 0.0
    elif recompute == "selective":
        extra = attn
    elif recompute == "op":
        extra = (attn / 2 if flash else 0.0) + 2.0 * m.layers * op_recompute_weights(m)
    elif recompute == "full":
        # Every layer's forward again, not the heads (nor a prediction depth's projection).
        extra = forward - (1 + m.mtp_layers) * logits - m.mtp_layers * 4.0 * m.d_model ** 2
    else:
        raise ValueError(f"recompute={recompute!r}")
    return FlopsPerToken(forward, attn, logits, train, train + extra)


def op_recompute_weights(m: ModelShape) -> int:
    """Weights (d_in x d_out) of one dense layer's linear matmuls that per-operator
    checkpointing runs again in backward, those whose outputs it does not save
    (:func:`shardlab.estimate.activations.op_checkpoint_saves`)."""
    sizes = [x.d_in * x.d_out for x in m.attention_linears]
    sizes += [m.d_model * m.d_ff] * m.mlp_matrices
    return sum(n for n, kept in zip(sizes, op_checkpoint_saves(m), strict=True) if not kept)


def train_flops_6nd(n_params: float, tokens: float) -> float:
    """The usual approximation 6·N·D (Kaplan et al. 2020): 2 FLOPs per weight per token, x3."""
    return 6.0 * n_params * tokens


def korthikanti_model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Korthikanti et al. 2022 Eq. 7: model FLOPs of one iteration, 72BLsh²(1 + s/6h + V/12hL)."""
    b, s, L, h, V = batch, seq, layers, hidden, vocab
    return 72.0 * b * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def narayanan_full_recompute_flops(batch: int, seq: int, layers: int, hidden: int,
                                   vocab: int) -> float:
    """Narayanan et al. 2021 Sec. 5.1: FLOPs of one iteration with full recompute,
    96·B·s·L·h²·(1 + s/6h + V/16Lh)."""
    b, s, L, h, V = batch, seq, layers, hidden, vocab
    return 96.0 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
