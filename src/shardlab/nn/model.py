"""A decoder-only transformer LM built from a ModelShape, parameter for parameter.

``gpt`` style: LayerNorm, biases on every linear layer, GELU MLP, learned positions,
head tied to the embedding. ``llama`` style: RMSNorm, no biases (q/k/v biases with
``qkv_bias``, as Qwen2; an RMSNorm over each head's query and key before rotary with
``qk_norm``, as Qwen3), SwiGLU MLP, rotary positions (Su et al. 2021), grouped-query
attention, untied head. With ``shape.moe``, blocks from ``moe.dense_layers`` on carry a
mixture-of-experts layer (:class:`shardlab.nn.moe.MoEFeedForward`) as their ``mlp``.
``numel`` equals :func:`shardlab.estimate.params.count_params` exactly (tested over many
shapes, MoE ones included).

The layout suits sharding: blocks in ``blocks`` (a ModuleList), linear layers named
``attn.{q,k,v,o}_proj`` (and ``attn.{q,k}_norm``) and ``mlp.{gate,up,down}_proj`` so a
tensor-parallel plan can address them (column-parallel q/k/v/gate/up, row-parallel
o/down), and ``embed``,
``pos``, ``final_norm``, ``lm_head`` that pipeline stages can own. A MoE block's ``mlp``
holds ``router``, ``experts.{w_gate,w_up,w_down}`` (grouped [E, ...] weights, ``b_up``,
``b_down`` in gpt style) and ``shared.{gate,up,down}_proj``.

Attention is causal and padding-aware: a key that is padding is never attended to.
Batches are right-padded, so every real query sees at least itself.

Context parallelism (:mod:`shardlab.distributed.context_parallel`) feeds the model a
rank's share of every sequence: ``forward`` then takes the global ``positions`` of its
tokens (learned positions and rotary angles are those of the whole sequence) and the
positions of the ``keys`` its attention sees, in their order, with ``pad_mask`` over the
keys; each :class:`Attention` gets a ``kv_gather`` that brings the other ranks' K and V.
Without them (one device, or any other layout) the arithmetic is the one-device one, op
for op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from shardlab.config.model import LN_EPS, RMS_EPS, ROPE_THETA, ModelShape, require_buildable
from shardlab.errors import SpecError
from shardlab.nn.mlp import MLP
from shardlab.nn.moe import MoEFeedForward, MoEOptions


def rope_tables(seq: int, head_dim: int, dtype: torch.dtype, theta: float = ROPE_THETA,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each [seq, head_dim] (halves repeated), at
    positions 0 .. seq-1, or at ``positions`` (a long [seq] tensor: a context-parallel
    rank's tokens are rotated by their place in the whole sequence)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    where = (torch.arange(seq, dtype=torch.float64) if positions is None
             else positions.to(torch.float64))
    angles = torch.outer(where, inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + hd/2) of ``x`` [b, heads, s, hd] by the position's angle."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attention_mask(pad_mask: torch.Tensor | None, seq: int, device: torch.device,
                   positions: torch.Tensor | None = None,
                   keys: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean [b or 1, 1, s, s]: True where query i may attend key j (j <= i, key real).

    With ``positions`` (long [q], the queries' places in the sequence) and ``keys`` (long
    [k], the keys' places, in the order attention sees them; default ``positions``):
    [b or 1, 1, q, k], True where keys[j] <= positions[i]; ``pad_mask`` is then over the
    keys, [b, k]."""
    if positions is None:
        causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    else:
        keys = positions if keys is None else keys
        causal = keys[None, :] <= positions[:, None]
    if pad_mask is None:
        return causal[None, None]
    return causal[None, None] & pad_mask[:, None, None, :].bool()


def make_norm(shape: ModelShape, dtype: torch.dtype) -> nn.Module:
    """LayerNorm (scale and shift) for gpt style, RMSNorm (scale) for llama style."""
    if shape.style == "gpt":
        return nn.LayerNorm(shape.d_model, eps=LN_EPS, dtype=dtype)
    return nn.RMSNorm(shape.d_model, eps=RMS_EPS, dtype=dtype)


def head_norm(x: torch.Tensor, norm: Callable[[torch.Tensor], torch.Tensor],
              head_dim: int) -> torch.Tensor:
    """``norm`` over each head of a projected ``x`` [b, s, heads*hd]: applied to the
    [b, s, heads, hd] view, as Qwen3's ``q_norm``/``k_norm`` (transformers'
    ``Qwen3Attention``: the projection viewed by head, normed, then rotated), returned
    [b, s, heads*hd]. Under tensor parallelism the heads are the rank's own and dim 2 is
    the one they are split on (torchtitan's ``SequenceParallel(sequence_dim=2)``)."""
    return norm(x.unflatten(-1, (-1, head_dim))).flatten(-2)


class Attention(nn.Module):
    """Multi-head attention with grouped K/V heads; q/k/v/o projections by name.

    With ``shape.qk_norm`` (Qwen3) ``q_norm`` and ``k_norm``, RMSNorms of ``head_dim``
    scales shared by every head, normalise each head's query and key before rotary. They
    run outside selective recomputation's checkpoint, as Megatron-Core's q/k layernorms run
    outside its core attention: backward keeps their inputs, and the core recomputes from
    their outputs.
    """

    def __init__(self, shape: ModelShape, dtype: torch.dtype) -> None:
        super().__init__()
        d, q, kv = shape.d_model, shape.q_dim, shape.kv_dim
        qkv_bias = shape.biases or shape.qkv_bias
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.rotary = shape.style == "llama"
        # Selective activation recomputation (Korthikanti et al. 2022): keep the attention
        # core's s x s intermediates out of memory and recompute them in backward.
        self.recompute_core = False
        # Context parallelism: (k, v) [b, kv heads, s/cp, hd] -> the whole sequence's, from
        # every cp rank (set by shardlab.distributed.context_parallel.apply_cp).
        self.kv_gather: Callable[[torch.Tensor, torch.Tensor],
                                 tuple[torch.Tensor, torch.Tensor]] | None = None
        self.q_proj = nn.Linear(d, q, bias=qkv_bias, dtype=dtype)
        self.k_proj = nn.Linear(d, kv, bias=qkv_bias, dtype=dtype)
        self.v_proj = nn.Linear(d, kv, bias=qkv_bias, dtype=dtype)
        self.o_proj = nn.Linear(q, d, bias=shape.biases, dtype=dtype)
        self.q_norm = (nn.RMSNorm(shape.head_dim, eps=RMS_EPS, dtype=dtype)
                       if shape.qk_norm else None)
        self.k_norm = (nn.RMSNorm(shape.head_dim, eps=RMS_EPS, dtype=dtype)
                       if shape.qk_norm else None)

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """x [b, s, d] -> [b, s, d]."""
        q, k = self.q_proj(x), self.k_proj(x)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = (head_norm(q, self.q_norm, self.head_dim),
                    head_norm(k, self.k_norm, self.head_dim))
        args = (q, k, self.v_proj(x), self.head_dim, mask, rope if self.rotary else None)
        if self.kv_gather is not None:
            return self.o_proj(self._attend_gathered(*args))
        if self.recompute_core and torch.is_grad_enabled():
            return self.o_proj(checkpoint(attend, *args, use_reentrant=False))
        return self.o_proj(attend(*args))

    def _attend_gathered(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         head_dim: int, mask: torch.Tensor,
                         rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Context parallel: this rank's queries over every rank's keys. K and V are
        rotated by their own positions, then gathered outside selective recomputation's
        checkpoint, so its backward recomputes the core without gathering again."""
        assert self.kv_gather is not None
        q, k, v = (split_heads(t, head_dim) for t in (q, k, v))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        k, v = self.kv_gather(k, v)  # [b, hkv, s, hd]: the whole sequence, gathered order
        if self.recompute_core and torch.is_grad_enabled():
            return checkpoint(attend_heads, q, k, v, mask, use_reentrant=False)
        return attend_heads(q, k, v, mask)


def split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[b, s, heads*hd] -> [b, heads, s, hd] (a view)."""
    b, s, _ = x.shape
    return x.view(b, s, -1, head_dim).transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int,
           mask: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Scaled dot-product attention of projected q [b, s, hq*hd] over k, v [b, s, hkv*hd].

    Shared with the tensor-parallel simulator, which calls it on a rank's own heads.
    """
    q = split_heads(q, head_dim)  # [b, hq, s, hd]
    k = split_heads(k, head_dim)  # [b, hkv, s, hd]
    v = split_heads(v, head_dim)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    return attend_heads(q, k, v, mask)


def attend_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
    """q [b, hq, sq, hd] over k, v [b, hkv, sk, hd] under ``mask`` [b or 1, 1, sq, sk]
    -> [b, sq, hq*hd]."""
    # Each kv head serves hq/hkv query heads (GQA, Ainslie et al. 2023). SDPA's enable_gqa
    # shares them inside the kernel, so backward keeps K and V at kv width; expanding them
    # first (repeat_interleave) would save them at query width too.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                         enable_gqa=q.shape[1] != k.shape[1])
    b, _, s, _ = q.shape
    return out.transpose(1, 2).reshape(b, s, -1)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.)).

    ``moe``: the block's ``mlp`` is a :class:`MoEFeedForward` with ``moe_options``
    (the shape must have ``moe``), else the dense :class:`MLP`.
    """

    def __init__(self, shape: ModelShape, dtype: torch.dtype, moe: bool = False,
                 moe_options: MoEOptions | None = None) -> None:
        super().__init__()
        self.attn_norm = make_norm(shape, dtype)
        self.attn = Attention(shape, dtype)
        self.mlp_norm = make_norm(shape, dtype)
        options = moe_options or MoEOptions()
        self.mlp: nn.Module = (
            MoEFeedForward(shape, dtype, aux_coef=options.aux_coef, z_coef=options.z_coef,
                           capacity_factor=options.capacity_factor, routing=options.routing)
            if moe else MLP(shape, dtype))

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x [b, s, d] -> [b, s, d]."""
        x = x + self.attn(self.attn_norm(x), mask, rope)
        return x + self.mlp(self.mlp_norm(x))


class TransformerLM(nn.Module):
    """The LM of a ModelShape: embed -> blocks -> final norm -> head (logits).

    ``moe_options`` (aux-loss and z-loss coefficients, capacity factor) apply to every MoE
    layer; they change no parameter.
    """

    def __init__(self, shape: ModelShape, dtype: torch.dtype = torch.float32,
                 seed: int = 0, moe_options: MoEOptions | None = None) -> None:
        super().__init__()
        require_buildable(shape)
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.d_model, dtype=dtype)
        self.pos = (nn.Embedding(shape.context, shape.d_model, dtype=dtype)
                    if shape.style == "gpt" else None)
        first_moe = shape.layers - shape.moe_layers  # = moe.dense_layers
        self.blocks = nn.ModuleList(Block(shape, dtype, i >= first_moe, moe_options)
                                    for i in range(shape.layers))
        self.final_norm = make_norm(shape, dtype)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab, bias=False, dtype=dtype)
        if shape.tied:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """GPT-2's init (Radford et al. 2019): N(0, 0.02) weights (routers and 3-D expert
        weights too), zero biases (experts' ``b_up``, ``b_down`` too), unit norms;
        deterministic from ``seed`` and independent of the global RNG."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.rsplit(".", 1)[-1] in ("bias", "b_up", "b_down"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.02)

    def rope(self, seq: int, positions: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Rotary tables for ``seq`` positions, or at ``positions`` (None for learned
        positions)."""
        if self.shape.style == "gpt":
            return None
        return rope_tables(seq, self.shape.head_dim, self.embed.weight.dtype,
                           self.shape.rope_theta, positions=positions)

    def embed_tokens(self, ids: torch.Tensor, positions: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """ids [b, s] -> hidden [b, s, d] (token plus learned position for gpt style, at
        0 .. s-1 or at ``positions``)."""
        h = self.embed(ids)
        if self.pos is not None:
            where = torch.arange(ids.shape[1], device=ids.device) if positions is None \
                else positions
            h = h + self.pos(where)
        return h

    def forward(self, ids: torch.Tensor, pad_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None,
                keys: torch.Tensor | None = None) -> torch.Tensor:
        """ids [b, s] (and 1/0 pad_mask [b, s]) -> logits [b, s, vocab].

        Context parallel (module docstring): ``positions`` (long [s]) the tokens' places in
        the whole sequence, ``keys`` (long [S]) the places of the keys attention sees, in
        order, and ``pad_mask`` [b, S] over those keys."""
        seq = ids.shape[1]
        whole = seq if keys is None else keys.shape[0]
        if whole > self.shape.context and self.pos is not None:
            raise SpecError("seq", whole, f"must be <= context ({self.shape.context})")
        mask = attention_mask(pad_mask, seq, ids.device, positions, keys)
        rope = self.rope(seq, positions)
        h = self.embed_tokens(ids, positions)
        for block in self.blocks:
            h = block(h, mask, rope)
        return self.lm_head(self.final_norm(h))


def numel(model: nn.Module) -> int:
    """Distinct parameters (a tied head counted once)."""
    return sum(p.numel() for p in model.parameters())
