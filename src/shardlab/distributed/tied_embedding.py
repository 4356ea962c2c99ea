"""A tied embedding and head split over pipeline stages: both copies get the tied gradient.

Tied embeddings (gpt style): with more than one stage, the first stage's ``embed.weight``
and the last stage's ``lm_head.weight`` are two copies of one parameter. As Megatron-LM
does (its "embedding group" all-reduce of the word-embedding gradients,
``megatron/core/distributed/finalize_model_grads.py``), :func:`sync_tied_grads` replaces
each copy's gradient by the sum of both after the backward, so both copies equal the
tied model's gradient, and an optimizer step keeps them identical.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from shardlab.distributed.pipeline import StageModule


def sync_tied_grads(stages: Sequence[StageModule],
                    pp_group: dist.ProcessGroup | None = None) -> None:
    """Give both copies of a tied embedding/head weight the sum of their gradients.

    Call on every pipeline rank after the backward (after ``step``) and before the
    optimizer step; ranks without a copy return at once. The first stage's
    ``embed.weight.grad`` and the last stage's ``lm_head.weight.grad`` are the two parts
    of the tied parameter's gradient; both become ``embed + head`` (Megatron-LM's
    embedding-group all-reduce). On one rank (V placement, or simulated ranks) the sum is
    local; across ranks the two exchange their parts with one send/receive pair. IEEE
    addition is commutative, so both copies get bit-identical gradients. A missing
    gradient counts as zero. Untied models and one-stage pipelines: nothing to do.
    """
    mine = [s for s in stages if s.holds_tied_copy]
    if not mine:
        return
    first = [s for s in mine if s.is_first]
    last = [s for s in mine if s.is_last]
    if first and last:
        a, b = first[0].tied_weight(), last[0].tied_weight()
        total = _grad_or_zeros(a) + _grad_or_zeros(b)
        a.grad, b.grad = total, total.clone()
        return
    stage = mine[0]
    weight = stage.tied_weight()
    grad = _grad_or_zeros(weight)
    # Under FSDP the gradient is this rank's DTensor shard; the peer stage's rank with the
    # same data-parallel index holds the same shard, so the local parts are exchanged.
    own = (grad.to_local() if isinstance(grad, DTensor) else grad).contiguous()
    peer_stage = stage.num_stages - 1 if stage.is_first else 0
    peer = stage.stage_ranks[peer_stage]
    if pp_group is not None:
        peer = dist.get_global_rank(pp_group, peer)
    other = torch.empty_like(own)
    ops = [dist.P2POp(dist.isend, own, peer, pp_group),
           dist.P2POp(dist.irecv, other, peer, pp_group)]
    if stage.is_last:  # the same order on both sides: first's send meets last's receive
        ops.reverse()
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    total = own + other
    weight.grad = (DTensor.from_local(total, grad.device_mesh, grad.placements,
                                      shape=grad.shape, stride=grad.stride())
                   if isinstance(grad, DTensor) else total)


def _grad_or_zeros(p: nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)
