"""Expert parallelism of shardlab's mixture-of-experts layers, from outside the model.

Each MoE layer's routed experts are split over the ``ep`` ranks of an expert-parallel
group: rank j holds the contiguous global experts j·E/ep .. (j+1)·E/ep - 1 (GShard,
Lepikhin et al. 2020; torchtitan's ``ExpertParallel`` and Megatron-LM's
``MoEAlltoAllTokenDispatcher`` split them the same way). The group is drawn from the
data-parallel ranks (dp = expert_dp x ep, ep innermost), so the ranks of one group hold
different tokens and different experts, and each expert is replicated over expert_dp.

:func:`apply_ep` replaces ``mlp.experts`` of every MoE block by :class:`ExpertParallel`,
through the model's expert-parallel hook (:class:`~shardlab.nn.moe.MoEFeedForward`
calls ``experts(x_sorted, counts)`` with rows sorted by *global* expert id and the global
counts). Its forward, on this rank's N kept assignments:

1. **counts** (``all_to_all_single`` of the E counts viewed ``[ep, E/ep]``): every rank
   learns how many rows each source sends to each of its local experts (skipped under
   contiguous routing, :mod:`shardlab.nn.moe_contiguous`: every rank of the group routed
   the same counts, known before the router ran);
2. **dispatch** (``all_to_all_single`` with uneven splits): the rows of experts j·E/ep..
   go to rank j. They arrive source-major (rank 0's rows for local experts 0..e, then
   rank 1's ...) and are regrouped expert-major for the grouped MLP;
3. the local experts (:func:`~shardlab.nn.moe.grouped_mlp` on this rank's weight shards);
4. **combine**: the outputs regrouped source-major and sent back along the same routes.

With expert tensor parallelism (etp = tp, Megatron-LM's ``--expert-tensor-parallel-size``)
each expert's width is split over the tensor-parallel ranks as the dense MLP's (gate and
up by columns, down by rows): every tensor-parallel rank routes the same tokens and
dispatches them in its own ep group, runs its width slice of its experts, and the
partial outputs are summed over tp before the combine (Megatron-LM's ``g``; the input
gradients in backward, its ``f``). With etp = 1 each tensor-parallel rank runs its
experts whole.

Dispatch and combine are ``all_to_all_single_autograd``
(``torch.distributed._functional_collectives``): the gradient of a dispatch is a combine
with the splits swapped, and vice versa. The expert weights are DTensors sharded on
dim 0 over the ``ep`` mesh dim (``Shard(0)``), so a distributed checkpoint keys them by
the whole model's names and global shapes and reshards them on load like any other
parameter.

**Gradients** (torchtitan's FSDP gradient divide factor for experts): every rank scales
its loss by dp / tokens of the global batch, so a dense parameter's gradient summed over
dp and divided by dp (FSDP's average) is one process's. An expert's gradient on a rank
already sums the tokens of the whole ep group (they were dispatched to it), so summing
over the expert_dp replicas covers every token once; dividing that by dp (not by
expert_dp, FSDP's default) gives one process's gradient again.
:func:`shard_experts` sets that factor on the experts' own ``fully_shard`` over the
``edp`` mesh dim.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import (
    all_to_all_single,
    all_to_all_single_autograd,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from shardlab.distributed.activation_checkpoint import named_blocks
from shardlab.distributed.measure import comm_label
from shardlab.distributed.saved import weight_local
from shardlab.errors import SpecError
from shardlab.estimate.comm import experts_cut_on_dim1
from shardlab.nn.moe import GroupedExperts, MoEFeedForward, grouped_mlp

EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down", "b_up", "b_down")
"""GroupedExperts' parameters (None where the style has none), each [E, ...]."""


def moe_layers(model: nn.Module) -> list[tuple[Any, MoEFeedForward]]:
    """(block key, MoE layer) of every block of ``model`` (a TransformerLM or a pipeline
    stage) whose MLP is a mixture of experts, under activation checkpointing too."""
    out = []
    for key, block in named_blocks(model):
        mlp = getattr(block, "_checkpoint_wrapped_module", block).mlp
        if isinstance(mlp, MoEFeedForward):
            out.append((key, mlp))
    return out


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    """A DTensor weight's local tensor, known to the saved-tensor meter as a weight."""
    return weight_local(t) if isinstance(t, DTensor) else t


# Expert tensor parallelism (etp = tp): each expert's hidden width split as the dense MLP's
# (Megatron-LM's column-parallel gate/up, row-parallel down): the dim of f in each weight.
ETP_DIM = {"w_gate": 2, "w_up": 2, "w_down": 1, "b_up": 1}


class _CopyToTP(torch.autograd.Function):
    """Megatron-LM's ``f``: identity forward; backward sums the input gradient over the
    tensor-parallel ranks (each computed the part of its own width slice)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron-LM's ``g``: forward sums the partial outputs over the tensor-parallel
    ranks; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class ExpertParallel(nn.Module):
    """This rank's E/ep experts of one MoE layer, reached by all-to-all (module docstring).

    Same parameter names as :class:`~shardlab.nn.moe.GroupedExperts` (``w_gate``, ``w_up``,
    ``w_down``, ``b_up``, ``b_down``), each a DTensor of the global shape [E, ...]:
    ``Shard(0)`` over ``mesh`` (1-D, ``ep``), or with expert tensor parallelism over a 2-D
    ``(ep, tp)`` mesh, ``Shard(0)`` and the width dim ``Shard`` over tp (:data:`ETP_DIM`;
    ``b_down`` replicated). The same call: ``(x_sorted [N, d] sorted by global expert id,
    counts LongTensor [E]) -> [N, d]``. With etp = tp every tensor-parallel rank routes
    the same tokens; each runs its width slice of its experts, and the partial outputs
    are summed over tp before the combine (and the input gradients in backward).
    """

    def __init__(self, experts: GroupedExperts, mesh: Any) -> None:
        super().__init__()
        names = tuple(mesh.mesh_dim_names or ("ep",))
        self.ep_group = mesh.get_group("ep") if len(names) > 1 else mesh.get_group()
        self.tp_group = mesh.get_group("tp") if "tp" in names else None
        self.ep = dist.get_world_size(self.ep_group)
        self.num_experts = experts.w_up.shape[0]
        if self.num_experts % self.ep:
            raise SpecError("ep", self.ep, f"must divide the experts ({self.num_experts})")
        for name in EXPERT_WEIGHTS:
            p = getattr(experts, name)
            if p is None:
                setattr(self, name, None)
                continue
            placements = [Shard(0)]
            if self.tp_group is not None:
                placements.append(Shard(ETP_DIM[name]) if name in ETP_DIM else Replicate())
            setattr(self, name, nn.Parameter(distribute_tensor(p.detach(), mesh, placements),
                                             requires_grad=p.requires_grad))

    def _experts(self, grouped: torch.Tensor, per_expert: list[int]) -> torch.Tensor:
        """The local experts on their expert-major rows (summed over tp with etp = tp)."""
        if self.tp_group is None:
            return grouped_mlp(grouped, per_expert, _local(self.w_gate), _local(self.w_up),
                               _local(self.w_down), _local(self.b_up), _local(self.b_down))
        grouped = _CopyToTP.apply(grouped, self.tp_group)
        out = grouped_mlp(grouped, per_expert, _local(self.w_gate), _local(self.w_up),
                          _local(self.w_down), _local(self.b_up))
        out = _ReduceFromTP.apply(out, self.tp_group)
        if self.b_down is not None:  # the row-parallel output's bias, added once
            # Each expert's bias over its rows, from the row counts alone (no tensor of
            # counts to read: a fake one has no values).
            bias = _local(self.b_down)
            out = out + torch.cat([bias[e].expand(n, -1) for e, n in enumerate(per_expert)])
        return out

    def forward(self, x_sorted: torch.Tensor,
                counts: torch.Tensor | tuple[int, ...]) -> torch.Tensor:
        """x_sorted [N, d] grouped by global expert, counts [E] (a LongTensor, or a tuple
        that every rank of the group routed alike: contiguous routing) -> the experts'
        outputs [N, d]."""
        ep, local = self.ep, self.num_experts // self.ep
        group = self.ep_group
        if isinstance(counts, tuple):
            # Every rank of the group routed the same counts (nn.moe_contiguous): what each
            # source sends this rank's experts is known without the counts all-to-all.
            me = dist.get_rank(group)
            got = [list(counts[me * local:(me + 1) * local])] * ep
            send = [sum(counts[j * local:(j + 1) * local]) for j in range(ep)]
        else:
            with torch.no_grad(), comm_label("ep_counts"):
                # got[s, e]: rows source rank s sends to this rank's local expert e
                got = all_to_all_single(counts.reshape(ep, local).contiguous(), None, None,
                                        group)
                got = got.view(ep, local).tolist()
            send = counts.reshape(ep, local).sum(dim=1).tolist()
        recv = [sum(row) for row in got]
        with comm_label("ep"):
            arrived = all_to_all_single_autograd(x_sorted, recv, send, group)
        # Source-major (s, e) segments -> expert-major (e, s) for the grouped MLP.
        pieces = arrived.split([n for row in got for n in row])
        grouped = torch.cat([pieces[s * local + e] for e in range(local) for s in range(ep)])
        per_expert = [sum(got[s][e] for s in range(ep)) for e in range(local)]
        out = self._experts(grouped, per_expert)
        pieces = out.split([got[s][e] for e in range(local) for s in range(ep)])
        back = torch.cat([pieces[e * ep + s] for s in range(ep) for e in range(local)])
        with comm_label("ep"):
            return all_to_all_single_autograd(back, send, recv, group)


def apply_ep(model: nn.Module, mesh: Any) -> nn.Module:
    """Replace ``mlp.experts`` of every MoE block of ``model`` by :class:`ExpertParallel`
    over ``mesh``: the 1-D ``ep`` dim, or the 2-D ``(ep, tp)`` dims for expert tensor
    parallelism. In place; returns the model. The model must be the same (same-seeded) on
    every rank: each keeps its part of the whole weights."""
    for _, moe in moe_layers(model):
        if not isinstance(moe.experts, GroupedExperts):
            raise SpecError("ep", mesh.size(), "experts are already expert-parallel")
        moe.experts = ExpertParallel(moe.experts, mesh)
    return model


def shard_experts(model: nn.Module, edp_mesh: Any, dp: int, *, shards: int | None = None,
                  reshard_after_forward: bool = True,
                  param_dtype: torch.dtype | None = None,
                  reduce_dtype: torch.dtype = torch.float32) -> nn.Module:
    """FSDP2 (``fully_shard``) of every expert-parallel layer over ``edp_mesh`` (the
    expert-data-parallel dim, dp / ep ranks; beside context parallelism (dp_shard/ep)·cp,
    and under HSDP the 2-D ``(dp_replicate, edp)`` mesh, ``shards`` its shard dim's
    ranks), before the blocks' own ``fully_shard`` (which then leaves the experts alone),
    with gradients divided by ``dp`` (the ranks the dense gradients are averaged over,
    dp·cp beside context parallelism; module docstring). The weights become 2-D
    (edp, ep) DTensors.

    The reduction is a SUM then a division by dp (``set_force_sum_reduction_for_comms``)
    whenever the shard dim has more than one rank: an average over edp would need a
    pre-multiplied sum, which gloo does not have. On one shard rank FSDP2 divides by the
    factor itself, without a reduce-scatter (and all-reduces the result across HSDP's
    replicas with a SUM).
    """
    shards = edp_mesh.size() if shards is None else shards
    policy = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
              if param_dtype is not None else MixedPrecisionPolicy())
    for _, moe in moe_layers(model):
        experts = moe.experts
        if not isinstance(experts, ExpertParallel):
            raise SpecError("ep", 1, "shard_experts needs expert-parallel layers (apply_ep)")
        fully_shard(experts, mesh=edp_mesh, mp_policy=policy,
                    reshard_after_forward=reshard_after_forward,
                    shard_placement_fn=expert_placement(
                        experts.num_experts // experts.ep, shards,
                        experts.tp_group is not None))
        experts.set_gradient_divide_factor(float(dp))  # type: ignore[operator]
        if shards > 1:
            # Not with one shard rank: there torch 2.13's foreach_reduce divides the copy it
            # makes in place of the reduce-scatter by the factor, and a forced sum divides
            # by it again after HSDP's all-reduce (1/dp² of the gradient). Unforced, that
            # all-reduce is a plain SUM, which gloo has.
            experts.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    return model


def expert_placement(local: int, shards: int, width_split: bool) -> Any:
    """FSDP2's ``shard_placement_fn`` for a rank's ``local`` experts over ``shards`` ranks:
    ``Shard(1)`` where :func:`~shardlab.estimate.comm.experts_cut_on_dim1` says so, else
    None (FSDP2's dim 0). A dry run of Mixtral 8x7B over ``dp=64 ep=8 zero=2`` held 93 GB
    gathered a rank with dim 0 (1 local expert padded to 8 shards), 14.5 GB with dim 1."""
    if not experts_cut_on_dim1(local, shards, width_split):
        return None
    return lambda param: Shard(1)


class RoutingRecorder:
    """What the routers of some modules did in each forward until :meth:`detach`: per
    forward, the MoE layer's key, its assignments per global expert before dropping
    (``last_counts``) and the assignments capacity dropped (``last_dropped``).

    Recomputed forwards (full activation checkpointing re-runs them inside backward) are
    left out, so there is one record per MoE layer and micro-batch, in the order this
    rank ran them: the same order on every rank of an expert-parallel group.
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._handles: list[Any] = []

    def attach(self, modules: list[nn.Module]) -> RoutingRecorder:
        """Record every forward of the MoE layers of ``modules``."""
        for module in modules:
            for key, moe in moe_layers(module):
                self._handles.append(moe.register_forward_hook(self._hook(str(key))))
        return self

    def _hook(self, key: str) -> Any:
        def record(module: Any, args: Any, out: Any) -> None:
            if torch._C._current_graph_task_id() != -1:  # a recompute inside backward
                return
            static = module.last_static_counts  # contiguous routing: no tensor to read
            counts = list(static) if static is not None else module.last_counts.tolist()
            self.records.append({"layer": key, "counts": counts,
                                 "dropped": int(module.last_dropped)})
        return record

    def detach(self) -> list[dict[str, Any]]:
        """Remove the hooks; the records."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return self.records
