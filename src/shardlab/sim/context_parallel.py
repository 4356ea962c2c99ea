"""Context parallel on virtual devices: each cp rank's tokens, and attention over all of them.

The cp ranks of a replica split every sequence zigzag (Llama 3, Dubey et al. 2024,
Sec. 3.3.2): rank c holds chunks c and 2cp-1-c of 2·cp equal chunks
(:func:`shardlab.estimate.context.rank_positions`), so its token ids, targets, loss mask,
learned positions and rotary angles are those positions of the whole sequence
(:func:`lane_tokens`). Attention is the all-gather form, per tensor rank: each cp rank
projects Q, K, V of its own tokens, rotates Q and K by its own positions, then K and V
(one [b, s/cp, 2·kv_dim/tp] tensor) are all-gathered along the sequence over the cp group
(kind ``cp``) and every rank attends with its queries to all s keys. The gather is
:func:`~shardlab.sim.tp_ops.gather_seq`, whose autograd reverse is the reduce-scatter
of dK, dV: each rank receives the gradient of its own K and V summed over the ranks
whose queries used them. Gathered keys arrive rank by rank, not in position order, so
each rank's causal mask is the rows of its queries and the columns of the gathered order
(:func:`lane_mask`); the softmax runs over the same keys as on one device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardlab.estimate.context import gathered_positions, rank_positions
from shardlab.nn.model import apply_rope, attention_mask
from shardlab.sim.tp_ops import gather_seq
from shardlab.sim.virtual_group import VirtualGroup

Rope = tuple[torch.Tensor, torch.Tensor]


def lane_positions(seq: int, cp: int, c: int) -> torch.Tensor:
    """Positions cp rank c holds, ascending (all of them when cp = 1): a long tensor."""
    if cp == 1:
        return torch.arange(seq)
    return torch.tensor(rank_positions(seq, cp, c), dtype=torch.long)


def lane_tokens(x: torch.Tensor, positions: torch.Tensor, cp: int) -> torch.Tensor:
    """The columns of x [b, s] at ``positions``: cp rank's share of ids, targets, masks."""
    return x if cp == 1 else x[:, positions]


def lane_mask(pad_mask: torch.Tensor, cp: int, positions: torch.Tensor) -> torch.Tensor:
    """Boolean [b, 1, s/cp, s]: query ``positions`` (rows) may attend the gathered keys
    (columns, in the all-gather's order) at or before them that are real tokens."""
    seq = pad_mask.shape[1]
    full = attention_mask(pad_mask, seq, pad_mask.device)
    if cp == 1:
        return full
    keys = torch.tensor(gathered_positions(seq, cp), dtype=torch.long)
    return full[:, :, positions][:, :, :, keys]


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[b, s, heads·hd] -> [b, heads, s, hd]."""
    b, s, _ = x.shape
    return x.view(b, s, -1, head_dim).transpose(1, 2)


def gathered_attention(group: VirtualGroup, qs: list[torch.Tensor], ks: list[torch.Tensor],
                       vs: list[torch.Tensor], head_dim: int, masks: list[torch.Tensor],
                       ropes: list[Rope | None]) -> list[torch.Tensor]:
    """Attention of every member of cp ``group`` (one tensor rank): qs, ks, vs the
    projections of each member's own tokens, [b, s/cp, heads·hd]; masks from
    :func:`lane_mask`; ropes the rotary tables of each member's positions (None for
    learned positions). Returns each member's [b, s/cp, q heads·hd] (module docstring)."""
    queries, kvs = [], []
    for q, k, v, rope in zip(qs, ks, vs, ropes, strict=True):
        q, k = _heads(q, head_dim), _heads(k, head_dim)  # [b, heads, s/cp, hd]
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        queries.append(q)
        b, local = v.shape[0], v.shape[1]
        kvs.append(torch.cat([k.transpose(1, 2).reshape(b, local, -1), v], dim=-1))
    gathered = gather_seq(group, kvs)  # [b, s, 2·kv_dim/tp] on every member, rank order
    out = []
    for q, kv, mask in zip(queries, gathered, masks, strict=True):
        k, v = (_heads(x, head_dim) for x in kv.chunk(2, dim=-1))  # [b, kv heads, s, hd]
        group_size = q.shape[1] // k.shape[1]
        if group_size > 1:  # grouped-query attention (Ainslie et al. 2023), as nn.model does
            k, v = k.repeat_interleave(group_size, dim=1), v.repeat_interleave(group_size, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [b, hq, s/cp, hd]
        out.append(o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1))
    return out
