"""A mixture-of-experts layer's routed experts over the devices of an expert-parallel group.

Device j of an ep group holds experts j·E/ep .. (j+1)·E/ep - 1 of the layer (GShard,
Lepikhin et al. 2020). Each device routes its own tokens with the router it holds, and
the rows go to the devices owning their experts and back by all-to-all (kind ``ep``):

1. route: the router's logits, Mixtral's top-k (:func:`shardlab.nn.moe.route`), and,
   with a capacity factor, each expert's first C assignments of this device's tokens
   (the rest dropped, never sent: their weight is zero);
2. permute the T·k (token, slot) rows by global expert id, so the rows for device j are
   one contiguous block: ``splits[i][j]`` rows go from i to j (dispatch);
3. on device j, the rows from every source regrouped expert by expert, each expert's MLP
   on its rows (:func:`shardlab.nn.moe.grouped_mlp`), and regrouped back by source;
4. the reverse all-to-all returns every row to its token's device (combine), which
   weights and sums them (:func:`shardlab.nn.moe.unpermute`).

The float math is :mod:`shardlab.nn.moe`'s, step for step as
:class:`~shardlab.nn.moe.MoEFeedForward` runs it; only the all-to-alls are added, so a
row meets the same expert weights as on one device. The auxiliary losses (load balance,
router z-loss) are those of each device's own tokens, attached to its output as the
model attaches them (:class:`~shardlab.nn.moe.AttachAuxLoss`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shardlab.config.model import ModelShape
from shardlab.nn.moe import (
    AttachAuxLoss,
    MoEOptions,
    Routing,
    dispatch,
    grouped_mlp,
    unpermute,
)
from shardlab.sim.ep_ops import all_to_all_autograd, transpose
from shardlab.sim.virtual_group import VirtualGroup

Params = dict[str, torch.Tensor]
CountLog = list[list[list[int]]]
"""One ``[ep][experts]`` matrix per MoE-layer forward: assignments each member of the ep
group routed to each global expert, before dropping (what
:func:`shardlab.estimate.expert.expert_alltoall_bytes` takes as ``routed``)."""


@dataclass(frozen=True)
class ExpertGroups:
    """What a stage's MoE layers need besides parameters: the options of the model's MoE
    layers, the ep group of each tensor rank, and where to log the router's counts (one
    log per tensor rank; None: do not log, e.g. when ZeRO-3 runs a forward again)."""

    options: MoEOptions
    groups: list[VirtualGroup]
    logs: list[CountLog] | None = None


def _route(shape: ModelShape, opts: MoEOptions, h: torch.Tensor, p: Params, pre: str
           ) -> tuple[Routing, list[int]]:
    """Route h [b, s, d] as :meth:`MoEFeedForward.forward` does (the model's own
    :func:`~shardlab.nn.moe.dispatch`); also the counts before dropping."""
    moe = shape.moe
    assert moe is not None
    tokens = h.reshape(-1, h.shape[-1])  # [T, d]
    logits = F.linear(tokens, p[pre + "router.weight"], p.get(pre + "router.bias"))  # [T, E]
    r = dispatch(tokens, logits, moe.experts_per_token, opts)
    return r, r.counts.tolist()


def _experts(p: Params, pre: str, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """This device's experts on their rows x [sum(counts), d], grouped by local expert."""
    w = pre + "experts."
    return grouped_mlp(x, counts, p.get(w + "w_gate"), p[w + "w_up"], p[w + "w_down"],
                       p.get(w + "b_up"), p.get(w + "b_down"))


def routed_experts(shape: ModelShape, opts: MoEOptions, group: VirtualGroup,
                   hs: list[torch.Tensor], ps: list[Params], pre: str,
                   log: CountLog | None = None) -> list[torch.Tensor]:
    """The routed part of MoE layer ``pre`` (``blocks.{i}.mlp.``) on every member of the
    ep ``group``: hs[j] [b, s, d] the normed input of member j, ps[j] its parameters (its
    own E/ep experts). Returns each member's routed output [b, s, d], carrying its
    auxiliary loss into backward (module docstring)."""
    moe = shape.moe
    assert moe is not None
    ep = group.size
    local = moe.experts // ep
    routed = []
    counts_before = []
    for h, p in zip(hs, ps, strict=True):
        r, raw = _route(shape, opts, h, p, pre)
        routed.append(r)
        counts_before.append(raw)
    if log is not None:
        log.append(counts_before)
    # counts[i][j][l]: rows source i sends for local expert l of member j.
    kept = [r.kept.tolist() for r in routed]
    counts = [[k[j * local:(j + 1) * local] for j in range(ep)] for k in kept]
    splits = [[sum(c) for c in row] for row in counts]
    received = all_to_all_autograd(group, [r.rows for r in routed], splits)  # dispatch
    outputs = []
    for j, (x, p) in enumerate(zip(received, ps, strict=True)):
        # Rows arrive source by source, each source's grouped by expert: regroup them
        # expert by expert for the experts, and back for the combine.
        blocks = [b.split(counts[i][j]) for i, b in enumerate(x.split(
            [splits[i][j] for i in range(ep)]))]
        by_expert = [blocks[i][e] for e in range(local) for i in range(ep)]
        rows = [sum(counts[i][j][e] for i in range(ep)) for e in range(local)]
        y = _experts(p, pre, torch.cat(by_expert), rows).split(
            [b.shape[0] for b in by_expert])
        outputs.append(torch.cat([y[e * ep + i] for i in range(ep) for e in range(local)]))
    back = all_to_all_autograd(group, outputs, transpose(splits))  # combine
    out = []
    for r, y, h in zip(routed, back, hs, strict=True):
        combined = unpermute(y, r.order, r.weights, r.tokens)
        if r.aux is not None and r.aux.requires_grad:
            combined = AttachAuxLoss.apply(combined, r.aux)
        out.append(combined.view_as(h))
    return out
