"""One pipeline stage of the LM, computed for every tensor-parallel rank at once.

The same mathematics as :class:`shardlab.nn.model.TransformerLM`, written over explicit
parameter dictionaries (one per tensor-parallel rank, sliced by :mod:`.shard`) so the
simulator can hold each virtual device's parameters itself, re-gather them (ZeRO-3)
and put Megatron's collectives between the column- and row-parallel halves of every
block (:mod:`.tp_ops`). Tensors are [batch, seq, hidden]; with sequence parallelism
the activations between blocks are [batch, seq / tp, hidden].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shardlab.config.model import ModelShape
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import attend, attention_mask, rope_tables
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


def stages_of(shape: ModelShape, pp: int) -> list[Stage]:
    """Layers split into pp contiguous stages, the first ones one layer larger if uneven."""
    base, extra = divmod(shape.layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(Stage(s, start, start + n, s == 0, s == pp - 1))
        start += n
    return out


@dataclass(frozen=True)
class Context:
    """What every stage forward needs besides parameters: shape, group, mask, rotary."""

    shape: ModelShape
    tp: VirtualGroup
    sp: bool
    mask: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor] | None


def make_context(shape: ModelShape, tp: VirtualGroup, sp: bool, pad_mask: torch.Tensor,
                 dtype: torch.dtype) -> Context:
    """Attention mask and rotary tables for a micro-batch."""
    seq = pad_mask.shape[1]
    rope = rope_tables(seq, shape.head_dim, dtype) if shape.style == "llama" else None
    return Context(shape, tp, sp, attention_mask(pad_mask, seq, pad_mask.device), rope)


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


def block(c: Context, i: int, ps: list[Params], xs: Tensors) -> Tensors:
    """Block i on every tensor-parallel rank: each rank computes its heads and its slice of
    the MLP; one collective enters and one leaves each half (Megatron's f and g)."""
    pre = f"blocks.{i}."
    hs = _enter(c, [_norm(c, x, p, pre + "attn_norm") for x, p in zip(xs, ps, strict=True)])
    att = [F.linear(attend(_linear(h, p, pre + "attn.q_proj"), _linear(h, p, pre + "attn.k_proj"),
                           _linear(h, p, pre + "attn.v_proj"), c.shape.head_dim, c.mask,
                           c.rope), p[pre + "attn.o_proj.weight"])
           for h, p in zip(hs, ps, strict=True)]
    att = _leave(c, att)  # row-parallel bias is added once, after the sum
    xs = [x + (a + p[pre + "attn.o_proj.bias"] if c.shape.biases else a)
          for x, a, p in zip(xs, att, ps, strict=True)]
    hs = _enter(c, [_norm(c, x, p, pre + "mlp_norm") for x, p in zip(xs, ps, strict=True)])
    ups = []
    for h, p in zip(hs, ps, strict=True):
        if c.shape.style == "llama":
            u = F.silu(_linear(h, p, pre + "mlp.gate_proj")) * _linear(h, p, pre + "mlp.up_proj")
        else:
            u = F.gelu(_linear(h, p, pre + "mlp.up_proj"), approximate="tanh")
        ups.append(F.linear(u, p[pre + "mlp.down_proj.weight"]))
    ups = _leave(c, ups)
    return [x + (u + p[pre + "mlp.down_proj.bias"] if c.shape.biases else u)
            for x, u, p in zip(xs, ups, ps, strict=True)]


def embed(c: Context, ps: list[Params], ids: torch.Tensor) -> Tensors:
    """Token (and learned position) embedding on every rank, whole; then each rank's
    sequence chunk under sequence parallelism."""
    positions = torch.arange(ids.shape[1], device=ids.device)
    hs = []
    for p in ps:
        h = F.embedding(ids, p["embed.weight"])
        if "pos.weight" in p:
            h = h + F.embedding(positions, p["pos.weight"])
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


def stage_forward(c: Context, stage: Stage, ps: list[Params], inputs: Tensors | torch.Tensor,
                  targets: torch.Tensor, loss_mask: torch.Tensor) -> Tensors:
    """The stage on every tensor-parallel rank: ids (first stage) or hidden states in;
    hidden states out, or the summed loss of each rank on the last stage."""
    xs = embed(c, ps, inputs) if stage.is_first else list(inputs)
    for i in range(stage.first_layer, stage.last_layer):
        xs = block(c, i, ps, xs)
    return head_loss(c, ps, xs, targets, loss_mask) if stage.is_last else xs
