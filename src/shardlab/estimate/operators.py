"""One transformer layer's forward pass as its primitive operators, each on the roofline.

Each operator reads its inputs from memory and writes its output (no fusion: what
fusion saves is the point of looking), and a matmul also reads its weights. For
``batch`` sequences of ``q_len`` new tokens attending to ``kv_len`` keys each
(training and prefill: q_len = kv_len = sequence; decode: q_len = 1, kv_len =
context, K and V read from the cache). Matmul FLOPs are exact (2mnk); those of
element-wise and reduction operators are approximate counts per element, marked
``~`` in the kind: LayerNorm 8, RMSNorm 4, softmax with scale and mask 5, GELU 8,
SiLU-and-multiply 6, rotary embedding 3, residual add 1 (the seed calculator's
counts where it has them; Qwen3's query/key norms and latent attention's latent norms
are RMSNorms of their own vectors). A mixture-of-experts MLP counts its top-k experts'
FLOPs and the weights of every expert the batch touches. Latent attention (``mla``)
lists its down and up projections one by one and runs in its training form, K and V
decompressed for every key (a decode engine that absorbs the up projections into the
query and output, DeepSeek-V2 Sec. 2.1.2, reads the latent cache instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.config.hardware import Accelerator
from shardlab.config.model import ModelShape
from shardlab.estimate.inference import weights_read_per_step
from shardlab.estimate.params import count_params
from shardlab.estimate.roofline import Roofline, roofline


@dataclass(frozen=True)
class Operator:
    """One operator: name, kind, FLOPs, bytes moved, and its roofline."""

    name: str
    kind: str
    roofline: Roofline


def layer_operators(m: ModelShape, acc: Accelerator, batch: int, q_len: int, kv_len: int,
                    bytes_per: int = 2, dtype: str = "bf16") -> list[Operator]:
    """The operators of one layer's forward pass (module docstring), on ``acc``'s roofline."""
    d, q, k, bp = m.d_model, m.q_dim, m.kv_dim, bytes_per
    n = batch * q_len                       # new tokens
    scores = batch * m.heads * q_len * kv_len  # attention score elements
    kv_read = batch * kv_len * k
    if m.moe is not None and m.moe_layers:
        e = m.moe
        f = e.experts_per_token * e.expert_d_ff + e.shared_experts * e.shared_d_ff
        pc = count_params(m)
        touched = weights_read_per_step(m, n) - (pc.total - pc.experts)
        mlp_weights = touched / m.moe_layers
    else:
        f = m.d_ff
        mlp_weights = m.mlp_matrices * d * f
    llama = m.style == "llama"
    norm = ("RMSNorm", "reduce~", 4) if llama else ("LayerNorm", "reduce~", 8)
    if m.mla is None:
        proj: list[tuple[str, str, float, float]] = [
            ("QKV projection", "matmul", 2 * n * d * (q + 2 * k),
             (n * d + d * (q + 2 * k) + n * (q + 2 * k)) * bp)]
        rotated = q + k
    else:
        proj = [(f"{x.name} projection", "matmul", 2 * n * x.d_in * x.d_out,
                 (n * x.d_in + x.d_in * x.d_out + n * x.d_out) * bp)
                for x in m.attention_linears[:-1]]
        rotated = (m.heads + 1) * m.mla.qk_rope_head_dim  # every query's, the shared key's
    v, o = m.v_dim, m.o_dim
    v_read = batch * kv_len * v
    ops: list[tuple[str, str, float, float]] = [
        (f"{norm[0]} 1", norm[1], norm[2] * n * d, 2 * n * d * bp), *proj]
    # Norms inside attention, each over its own vectors: Qwen3's of every query and key
    # head (after the projection), latent attention's of its two latents.
    inner = (q + k if m.qk_norm else 0) if m.mla is None else (
        m.mla.q_lora_rank + m.mla.kv_lora_rank)
    if inner:
        name = "query/key RMSNorm" if m.mla is None else "latent RMSNorms"
        ops.append((name, "reduce~", 4 * n * inner, 2 * n * inner * bp))
    if llama:
        ops.append(("rotary embedding", "elementwise~", 3 * n * rotated, 2 * n * rotated * bp))
    ops += [
        ("Q·Kᵀ scores", "matmul", 2 * batch * q_len * kv_len * q, (n * q + kv_read + scores) * bp),
        ("scale+mask+softmax", "reduce~", 5 * scores, 2 * scores * bp),
        ("scores·V", "matmul", 2 * batch * q_len * kv_len * o, (scores + v_read + n * o) * bp),
        ("output projection", "matmul", 2 * n * o * d, (n * o + o * d + n * d) * bp),
        ("residual add 1", "elementwise~", n * d, 3 * n * d * bp),
        (f"{norm[0]} 2", norm[1], norm[2] * n * d, 2 * n * d * bp),
    ]
    if llama:
        up_weights = 2 * mlp_weights / 3
        ops += [
            ("gate+up projection", "matmul", 4 * n * d * f, (n * d + up_weights + 2 * n * f) * bp),
            ("SiLU·up", "elementwise~", 6 * n * f, 3 * n * f * bp),
            ("down projection", "matmul", 2 * n * f * d,
             (n * f + mlp_weights - up_weights + n * d) * bp),
        ]
    else:
        ops += [
            ("MLP up d→ff", "matmul", 2 * n * d * f, (n * d + mlp_weights / 2 + n * f) * bp),
            ("GELU", "elementwise~", 8 * n * f, 2 * n * f * bp),
            ("MLP down ff→d", "matmul", 2 * n * f * d, (n * f + mlp_weights / 2 + n * d) * bp),
        ]
    ops.append(("residual add 2", "elementwise~", n * d, 3 * n * d * bp))
    peak, bw = acc.peak(dtype), acc.memory_bandwidth
    return [Operator(name, kind, roofline(fl, by, peak, bw)) for name, kind, fl, by in ops]
