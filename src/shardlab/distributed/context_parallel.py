"""Context parallelism: every sequence split over the cp ranks, attention over all of it.

Llama 3's form (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3.2): the s
tokens of a sequence are cut into 2·cp chunks of c = s/(2·cp) and cp rank i holds chunks
i and 2cp-1-i (:func:`local_positions`), so under the causal mask every rank has the same
attention work (the first chunks see few keys, the last many). Everything but attention
is per token and runs on the rank's s/cp tokens unchanged. In attention each rank
projects Q, K and V of its own tokens, rotates Q and K by their global positions, and
all-gathers K and V over the cp group; its queries then attend to all s keys, which
arrive rank by rank (:func:`key_positions`), under the causal mask of the queries' and
keys' global positions (:func:`shardlab.nn.model.attention_mask`). With grouped-query
attention the gathered K and V are ``kv_heads`` wide, not ``heads``: the gather is cheap
where the sequence is long.

The gather is ``torch.distributed._functional_collectives.all_gather_single_autograd``
(torch 2.13's name for ``all_gather_tensor_autograd``, which it deprecates): its
autograd reverse reduce-scatters dK and dV, so each rank receives the gradient of its
own K and V summed over every rank whose queries used them. It is a plain collective on
the cp group's ProcessGroup, so the same code runs on gloo, NCCL and the dry run's fake
group. torch's own ``context_parallel()`` (``torch.distributed.tensor.experimental``)
has no sharding strategy for the CPU fused kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, probed on torch 2.13); this is
shardlab's, built on torch collectives, and the same on every device.

The cp ranks of a replica hold the same parameters and see different tokens, so their
gradients are summed over dp x cp: FSDP shards over dp x cp (torchtitan's ``dp_shard_cp``
mesh, :func:`shardlab.distributed.mesh.make_mesh`) and every rank's summed token loss is
scaled by dp·cp / (the global batch's real tokens), since FSDP averages over dp x cp.

The placement is :mod:`shardlab.estimate.context`'s (the cost model's); the simulator's
form is :mod:`shardlab.sim.context_parallel`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn

from shardlab.distributed.measure import comm_label
from shardlab.estimate.context import chunk_tokens, zigzag_chunks
from shardlab.nn.data import Batch
from shardlab.nn.model import Attention
from shardlab.nn.moe import MoEFeedForward

KvGather = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def local_positions(seq: int, cp: int, rank: int,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """Positions (long [s/cp], ascending) of the tokens cp rank ``rank`` holds: chunks
    ``rank`` and ``2cp-1-rank`` of the 2·cp chunks of a ``seq``-token sequence."""
    c = chunk_tokens(seq, cp)
    return torch.cat([torch.arange(k * c, (k + 1) * c, device=device)
                      for k in zigzag_chunks(cp, rank)])


def key_positions(seq: int, cp: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Positions (long [s]) of the keys after the all-gather, in its order: rank 0's
    tokens, then rank 1's, ..."""
    return torch.cat([local_positions(seq, cp, r, device) for r in range(cp)])


@dataclass
class CpShard:
    """A cp rank's share of a batch: its tokens (``batch``: ids, targets, loss mask and
    padding mask, [b, s/cp] each, in ascending position), the padding mask of every key
    in the gathered order ([b, s]), and the positions of both."""

    batch: Batch
    key_pad: torch.Tensor
    positions: torch.Tensor
    keys: torch.Tensor

    def model_inputs(self) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """``TransformerLM.forward``'s arguments for this shard."""
        return (self.batch.input_ids, self.key_pad), {"positions": self.positions,
                                                      "keys": self.keys}


def shard_sequence(batch: Batch, cp: int, rank: int) -> CpShard:
    """cp rank ``rank``'s share of ``batch`` [b, s] (every cp rank holds the whole batch
    and takes its columns: no communication)."""
    device = batch.input_ids.device
    positions = local_positions(batch.seq, cp, rank, device)
    keys = key_positions(batch.seq, cp, device)
    local = Batch(*(t[:, positions] for t in (batch.input_ids, batch.targets,
                                              batch.loss_mask, batch.pad_mask)))
    return CpShard(local, batch.pad_mask[:, keys], positions, keys)


def kv_all_gather(group: Any, cp: int) -> KvGather:
    """``kv_gather`` for :class:`~shardlab.nn.model.Attention`: k, v [b, hkv, s/cp, hd]
    -> [b, hkv, s, hd] each, rank by rank along the sequence, in one all-gather of the
    two stacked (so one collective per layer and pass); its backward is the
    reduce-scatter of dK, dV."""

    def gather(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, heads, local, hd = k.shape
        kv = torch.cat([k, v], dim=1)  # [b, 2·hkv, s/cp, hd], contiguous
        out = funcol.all_gather_single_autograd(kv, 0, group)  # [cp·b, 2·hkv, s/cp, hd]
        out = out.view(cp, b, 2 * heads, local, hd).permute(1, 2, 0, 3, 4)
        out = out.reshape(b, 2 * heads, cp * local, hd)
        return out[:, :heads], out[:, heads:]

    return gather


@dataclass
class CountSum:
    """A MoE layer's expert counts summed over the cp group (its load-balancing loss's f
    over the whole sequences: :func:`shardlab.nn.moe.load_balance_loss`), an all-reduce
    of E int64 the comm meter files as ``moe_counts`` (the cost model leaves these bytes
    out, as it does the ep count exchange)."""

    group: Any
    ranks: int

    def __call__(self, counts: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), comm_label("moe_counts"):
            return funcol.all_reduce(counts, "sum", self.group)


def apply_cp(model: nn.Module, cp_mesh: Any, group: Any = None) -> nn.Module:
    """Give every attention layer of ``model`` (a TransformerLM or pipeline stage) the
    all-gather of K and V over the 1-D ``cp_mesh`` (on ``group``, its ranks' own process
    group, when given), and every MoE layer the sum of its load-balancing counts over the
    same group (:class:`CountSum`); in place. A TransformerLM is fed :func:`shard_sequence`'s shares
    by its caller (:meth:`CpShard.model_inputs`); a pipeline stage (which has a
    ``context``) is told its cp rank and builds the positions itself."""
    cp = cp_mesh.size()
    group = cp_mesh.get_group() if group is None else group
    gather = kv_all_gather(group, cp)
    for module in model.modules():
        if isinstance(module, Attention):
            module.kv_gather = gather
        elif isinstance(module, MoEFeedForward):
            module.count_reducer = CountSum(group, cp)
    if hasattr(model, "context"):
        model.context = (cp, cp_mesh.get_local_rank())
    return model
