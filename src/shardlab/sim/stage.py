"""One pipeline stage of the LM, computed for every tensor-parallel rank at once.

The same mathematics as :class:`shardlab.nn.model.TransformerLM`, written over explicit
parameter dictionaries (one per tensor-parallel rank, sliced by :mod:`.shard`) so the
simulator can hold each virtual device's parameters itself, re-gather them (ZeRO-3)
and put Megatron's collectives between the column- and row-parallel halves of every
block (:mod:`.tp_ops`). Tensors are [batch, seq, hidden]; with sequence parallelism
the activations between blocks are [batch, seq / tp, hidden].

A stage runs for the lanes of one unit at once: the replicas of one expert-parallel group,
whose MoE layers exchange tokens (:mod:`.moe`), or the context-parallel ranks of one
replica, whose attention gathers K and V (:mod:`.context_parallel`); one lane without
either. The rest of each block is every lane's own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shardlab.config.model import RMS_EPS, ModelShape
from shardlab.estimate.partition import chunk_layers
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import attend, head_norm, rope_tables
from shardlab.sim.context_parallel import gathered_attention, lane_mask, lane_positions
from shardlab.sim.moe import ExpertGroups, routed_experts
from shardlab.sim.tp_ops import (
    copy_to_tp,
    gather_seq,
    gather_seq_whole,
    reduce_from_tp,
    reduce_scatter_seq,
    split_seq,
)
from shardlab.sim.virtual_group import VirtualGroup

Params = dict[str, torch.Tensor]
Tensors = list[torch.Tensor]


@dataclass(frozen=True)
class Stage:
    """Which part of the model a pipeline stage holds."""

    index: int
    first_layer: int
    last_layer: int  # exclusive
    is_first: bool
    is_last: bool

    def param_names(self, shape: ModelShape, all_names: list[str], pp: int) -> list[str]:
        """Names of the parameters this stage holds, in the model's order. A tied head on
        a stage without the embedding holds its own copy, ``lm_head.weight``."""
        names = []
        for n in all_names:
            if n.startswith("blocks."):
                if self.first_layer <= int(n.split(".")[1]) < self.last_layer:
                    names.append(n)
            elif n.startswith(("embed.", "pos.")):
                if self.is_first:
                    names.append(n)
            elif (n.startswith(("final_norm.", "lm_head.")) and self.is_last):
                names.append(n)
        if self.is_last and shape.tied and pp > 1:
            names.append("lm_head.weight")
        return names


def stages_of(shape: ModelShape, pp: int, stage_layers: tuple[int, ...] = ()) -> list[Stage]:
    """Layers split into pp contiguous stages: ``stage_layers`` of them each when given
    (uneven stages), else the first ones one layer larger if uneven
    (:func:`shardlab.estimate.partition.chunk_layers`, the cost model's split)."""
    out, start = [], 0
    for s, n in enumerate(chunk_layers(shape.layers, pp, 1, stage_layers)):
        out.append(Stage(s, start, start + n, s == 0, s == pp - 1))
        start += n
    return out


@dataclass(frozen=True)
class Context:
    """What every stage forward of one lane needs besides parameters: shape, tensor group,
    mask, rotary tables and token positions of the lane's tokens, a MoE model's ep groups,
    and with context parallelism the cp group of each tensor rank."""

    shape: ModelShape
    tp: VirtualGroup
    sp: bool
    mask: torch.Tensor  # [b or 1, 1, lane's queries, keys]
    rope: tuple[torch.Tensor, torch.Tensor] | None  # at the lane's positions
    positions: torch.Tensor  # the lane's token positions in the sequence
    experts: ExpertGroups | None = None
    cp: list[VirtualGroup] | None = None


def make_context(shape: ModelShape, tp: VirtualGroup, sp: bool, pad_mask: torch.Tensor,
                 dtype: torch.dtype, experts: ExpertGroups | None = None,
                 cp: list[VirtualGroup] | None = None, cp_rank: int = 0) -> Context:
    """Attention mask, rotary tables and positions for a micro-batch (and a MoE model's ep
    groups); with ``cp`` (one group per tensor rank), those of cp rank ``cp_rank``'s tokens
    (:mod:`.context_parallel`)."""
    seq = pad_mask.shape[1]
    size = 1 if cp is None else cp[0].size
    positions = lane_positions(seq, size, cp_rank)
    rope = (rope_tables(seq, shape.head_dim, dtype, shape.rope_theta)
            if shape.style == "llama" else None)
    if rope is not None and size > 1:
        rope = (rope[0][positions], rope[1][positions])
    return Context(shape, tp, sp, lane_mask(pad_mask, size, positions), rope, positions,
                   experts, cp if size > 1 else None)


def _norm(c: Context, x: torch.Tensor, p: Params, name: str) -> torch.Tensor:
    d = (c.shape.d_model,)
    if c.shape.style == "gpt":
        return F.layer_norm(x, d, p[f"{name}.weight"], p[f"{name}.bias"], eps=1e-5)
    return F.rms_norm(x, d, p[f"{name}.weight"], eps=1e-6)


def _linear(x: torch.Tensor, p: Params, name: str) -> torch.Tensor:
    return F.linear(x, p[f"{name}.weight"], p.get(f"{name}.bias"))


def _enter(c: Context, xs: Tensors) -> Tensors:
    return gather_seq(c.tp, xs) if c.sp else copy_to_tp(c.tp, xs)


def _leave(c: Context, xs: Tensors) -> Tensors:
    return reduce_scatter_seq(c.tp, xs) if c.sp else reduce_from_tp(c.tp, xs)


def _qkv(c: Context, pre: str, ps: list[Params], xs: Tensors
         ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Q, K and V of every tensor rank's heads, [b, s, heads·hd] each, after the norm and f
    (and Qwen3's per-head query/key norms on the rank's own heads)."""
    hs = _enter(c, [_norm(c, x, p, pre + "attn_norm") for x, p in zip(xs, ps, strict=True)])
    out = []
    for h, p in zip(hs, ps, strict=True):
        q, k = _linear(h, p, pre + "attn.q_proj"), _linear(h, p, pre + "attn.k_proj")
        if c.shape.qk_norm:
            hd = c.shape.head_dim
            q, k = (head_norm(x, functools.partial(F.rms_norm, normalized_shape=(hd,),
                                                   weight=p[pre + name], eps=RMS_EPS), hd)
                    for x, name in ((q, "attn.q_norm.weight"), (k, "attn.k_norm.weight")))
        out.append((q, k, _linear(h, p, pre + "attn.v_proj")))
    return out


def attention_half(cs: list[Context], i: int, pss: list[list[Params]], xss: list[Tensors]
                   ) -> list[Tensors]:
    """Block i's attention on every tensor-parallel rank of each lane (cs, pss, xss: one
    entry per lane, each a list over tensor ranks): each rank computes its heads; one
    collective enters and one leaves (Megatron's f and g). With context parallelism the
    lanes are one cp group's, whose K and V are all-gathered per tensor rank."""
    pre = f"blocks.{i}."
    qkv = [_qkv(c, pre, ps, xs) for c, ps, xs in zip(cs, pss, xss, strict=True)]
    hd = cs[0].shape.head_dim
    if cs[0].cp is None:
        atts = [[attend(q, k, v, hd, c.mask, c.rope) for q, k, v in lane]
                for c, lane in zip(cs, qkv, strict=True)]
    else:
        by_rank = []  # per tensor rank, every lane's attention output
        for t, group in enumerate(cs[0].cp):
            qs, ks, vs = ([lane[t][j] for lane in qkv] for j in range(3))
            by_rank.append(gathered_attention(group, qs, ks, vs, hd, [c.mask for c in cs],
                                              [c.rope for c in cs]))
        atts = [[out[m] for out in by_rank] for m in range(len(cs))]
    out = []
    for c, ps, xs, lane in zip(cs, pss, xss, atts, strict=True):
        att = _leave(c, [F.linear(a, p[pre + "attn.o_proj.weight"])
                         for a, p in zip(lane, ps, strict=True)])
        # The row-parallel bias is added once, after the sum.
        out.append([x + (a + p[pre + "attn.o_proj.bias"] if c.shape.biases else a)
                    for x, a, p in zip(xs, att, ps, strict=True)])
    return out


def _mlp(c: Context, pre: str, ps: list[Params], hs: Tensors) -> Tensors:
    """The MLP ``pre`` (``blocks.{i}.mlp.`` or a MoE layer's ``...mlp.shared.``) on every
    tensor rank's slice of its width, entered and left through f and g."""
    hs = _enter(c, hs)
    ups = []
    for h, p in zip(hs, ps, strict=True):
        if c.shape.style == "llama":
            u = F.silu(_linear(h, p, pre + "gate_proj")) * _linear(h, p, pre + "up_proj")
        else:
            u = F.gelu(_linear(h, p, pre + "up_proj"), approximate="tanh")
        ups.append(F.linear(u, p[pre + "down_proj.weight"]))
    ups = _leave(c, ups)
    return [u + p[pre + "down_proj.bias"] if c.shape.biases else u
            for u, p in zip(ups, ps, strict=True)]


def mlp_half(c: Context, i: int, ps: list[Params], xs: Tensors) -> Tensors:
    """Block i's dense MLP on every tensor-parallel rank (column- then row-parallel)."""
    hs = [_norm(c, x, p, f"blocks.{i}.mlp_norm") for x, p in zip(xs, ps, strict=True)]
    return [x + u for x, u in zip(xs, _mlp(c, f"blocks.{i}.mlp.", ps, hs), strict=True)]


def moe_half(cs: list[Context], i: int, pss: list[list[Params]], xss: list[Tensors]
             ) -> list[Tensors]:
    """Block i's MoE layer on every replica of an ep group (cs, pss, xss: one entry per
    replica, each a list over tensor ranks). The routed experts are whole on every tensor
    rank, which exchanges tokens with the same tensor rank of the other replicas; the
    shared experts are split over tp as the dense MLP is."""
    ex, shape = cs[0].experts, cs[0].shape
    assert ex is not None and shape.moe is not None
    pre = f"blocks.{i}.mlp."
    hss = [[_norm(c, x, p, f"blocks.{i}.mlp_norm") for x, p in zip(xs, ps, strict=True)]
           for c, ps, xs in zip(cs, pss, xss, strict=True)]
    routed = [routed_experts(shape, ex.options, group, [hs[t] for hs in hss],
                             [ps[t] for ps in pss], pre,
                             ex.logs[t] if ex.logs is not None else None)
              for t, group in enumerate(ex.groups)]
    out = []
    for r, (c, ps, xs, hs) in enumerate(zip(cs, pss, xss, hss, strict=True)):
        ys = [routed[t][r] for t in range(len(xs))]
        if shape.moe.shared_experts:
            ys = [y + s for y, s in zip(ys, _mlp(c, pre + "shared.", ps, hs), strict=True)]
        out.append([x + y for x, y in zip(xs, ys, strict=True)])
    return out


def is_moe_layer(shape: ModelShape, i: int) -> bool:
    """Layer i carries a MoE layer: the model has experts and i is past its dense layers."""
    return shape.moe is not None and i >= shape.layers - shape.moe_layers


def embed(c: Context, ps: list[Params], ids: torch.Tensor) -> Tensors:
    """Token (and learned position) embedding of the lane's tokens on every rank, whole;
    then each rank's sequence chunk under sequence parallelism."""
    hs = []
    for p in ps:
        h = F.embedding(ids, p["embed.weight"])
        if "pos.weight" in p:
            h = h + F.embedding(c.positions, p["pos.weight"])
        hs.append(h)
    return split_seq(c.tp, hs) if c.sp else hs


def head_loss(c: Context, ps: list[Params], xs: Tensors, targets: torch.Tensor,
              loss_mask: torch.Tensor) -> Tensors:
    """Final norm, head and summed token loss on every rank (the head is whole)."""
    if c.sp:
        xs = gather_seq_whole(c.tp, xs)
    out = []
    for x, p in zip(xs, ps, strict=True):
        w = p["lm_head.weight"] if "lm_head.weight" in p else p["embed.weight"]
        logits = F.linear(_norm(c, x, p, "final_norm"), w)
        out.append(lm_loss_sum(logits, targets, loss_mask))
    return out


def stage_forward(cs: list[Context], stage: Stage, pss: list[list[Params]],
                  inputs: list[Tensors | torch.Tensor], targets: list[torch.Tensor],
                  loss_masks: list[torch.Tensor]) -> list[Tensors]:
    """The stage on every tensor-parallel rank of each lane of one unit (one entry per
    lane in every list; module docstring): the lane's ids (first stage) or hidden states
    in; hidden states out, or the summed loss of each rank on the last stage."""
    xss = [embed(c, ps, x) if stage.is_first else list(x)
           for c, ps, x in zip(cs, pss, inputs, strict=True)]
    for i in range(stage.first_layer, stage.last_layer):
        xss = attention_half(cs, i, pss, xss)
        if is_moe_layer(cs[0].shape, i):
            xss = moe_half(cs, i, pss, xss)
        else:
            xss = [mlp_half(c, i, ps, xs) for c, ps, xs in zip(cs, pss, xss, strict=True)]
    if not stage.is_last:
        return xss
    return [head_loss(c, ps, xs, t, m)
            for c, ps, xs, t, m in zip(cs, pss, xss, targets, loss_masks, strict=True)]
