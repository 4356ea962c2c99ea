"""Serving: KV cache, prefill and decode lower bounds, the largest batch that fits.

* KV cache per token: 2 (K and V) · L · kv_heads · head_dim · bytes (GQA shrinks it
  by heads/kv_heads). Latent attention caches its latent and the shared rotary key
  instead, L · (kv_lora_rank + qk_rope_head_dim) · bytes (DeepSeek-V2, arXiv 2405.04434,
  Table 1: (d_c + d_h^R)·l elements; DeepSeek-V3: 70,272 bytes a token in bf16).
* A decode step reads every weight once for the whole batch and each sequence's
  KV cache, and does batch · (2·matmul weights + 4·L·context·q_dim) FLOPs; its
  time is at least the roofline max (the seed calculator; Pope et al. 2022,
  "Efficiently Scaling Transformer Inference"). For a mixture of experts only
  the experts some token of the batch picks are read: with uniform, independent
  routing of top-k of E, E·(1 - (1 - k/E)^batch) per layer in expectation. Latent
  attention decodes in its absorbed form (DeepSeek-V2 Sec. 2.1.2: the key up projection
  folded into the query's, the value's into the output's), attending over the cached
  latent: 2·L·context·heads·(2·kv_lora_rank + qk_rope_head_dim) FLOPs a token (scores of
  kv_lora + rope terms, sums of kv_lora); its weights' FLOPs are the same.
* Prefill processes the whole prompt at once: the same weights, prompt x the
  FLOPs, and writes the prompt's KV cache.
* Tensor parallel over ``devices`` is taken as a perfect split of FLOPs, bytes
  and memory (communication left out).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.config.hardware import Accelerator
from shardlab.config.model import ModelShape
from shardlab.estimate.flops import attention_core_flops_per_token, matmul_weights_per_token
from shardlab.estimate.params import count_params, mlp_params
from shardlab.estimate.roofline import Roofline, roofline


def kv_bytes_per_token(m: ModelShape, bytes_per: int = 2) -> int:
    """KV-cache bytes per token: 2 · layers · kv_heads · head_dim · bytes_per, or latent
    attention's layers · (kv_lora_rank + qk_rope_head_dim) · bytes_per (module docstring)."""
    if m.mla is not None:
        return m.layers * (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * bytes_per
    return 2 * m.layers * m.kv_heads * m.head_dim * bytes_per


def decode_attention_flops_per_token(m: ModelShape, context: int) -> float:
    """FLOPs of one decoded token's attention over ``context`` cached tokens, all layers:
    4·L·context·q_dim, or latent attention's absorbed 2·L·context·heads·(2·kv_lora_rank +
    qk_rope_head_dim) (module docstring)."""
    if m.mla is not None:
        a = m.mla
        return 2.0 * m.layers * context * m.heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
    return attention_core_flops_per_token(m, context, causal=False)


def weights_read_per_step(m: ModelShape, batch: int) -> float:
    """Parameters a decode step of ``batch`` tokens reads (expected, for MoE: module doc)."""
    total = count_params(m).total
    if m.moe is None:
        return float(total)
    e = m.moe
    touched = e.experts * (1 - (1 - e.experts_per_token / e.experts) ** batch)
    per_expert = mlp_params(m, e.expert_d_ff)
    return total - m.moe_layers * (e.experts - touched) * per_expert


@dataclass(frozen=True)
class Step:
    """One prefill or decode step: its roofline and tokens per second."""

    roofline: Roofline
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        """Tokens produced (decode) or processed (prefill) per second at the bound."""
        return self.tokens / self.roofline.seconds


def decode_step(m: ModelShape, acc: Accelerator, batch: int, context: int, devices: int = 1,
                bytes_per: int = 2, dtype: str = "bf16") -> Step:
    """Lower bound of one decode step: ``batch`` sequences, each ``context`` tokens long."""
    nbytes = (weights_read_per_step(m, batch) + kv_bytes_per_token(m, 1) * context * batch
              ) * bytes_per
    flops = batch * (2.0 * matmul_weights_per_token(m)
                     + decode_attention_flops_per_token(m, context))
    return Step(roofline(flops, nbytes, devices * acc.peak(dtype),
                         devices * acc.memory_bandwidth), batch)


def prefill_step(m: ModelShape, acc: Accelerator, batch: int, prompt: int, devices: int = 1,
                 bytes_per: int = 2, dtype: str = "bf16", causal: bool = True) -> Step:
    """Lower bound of prefilling ``batch`` prompts of ``prompt`` tokens (writes their KV)."""
    tokens = batch * prompt
    nbytes = (weights_read_per_step(m, tokens) + kv_bytes_per_token(m, 1) * tokens) * bytes_per
    flops = tokens * (2.0 * matmul_weights_per_token(m)
                      + attention_core_flops_per_token(m, prompt, causal=causal))
    return Step(roofline(flops, nbytes, devices * acc.peak(dtype),
                         devices * acc.memory_bandwidth), tokens)


def max_decode_batch(m: ModelShape, acc: Accelerator, context: int, devices: int = 1,
                     bytes_per: int = 2) -> int:
    """Most sequences of ``context`` tokens whose KV cache fits beside the weights (0: none)."""
    free = devices * acc.memory_bytes - count_params(m).total * bytes_per
    per_seq = kv_bytes_per_token(m, bytes_per) * context
    return max(0, int(free // per_seq))
