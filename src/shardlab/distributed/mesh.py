"""The device mesh a run lays its model out on, with its dims by name.

Dense runs: ``(pp, dp, tp)``. With expert parallelism (``ep > 1``) the data-parallel
ranks are split in two, ``(pp, edp, ep, tp)``, ep innermost, as torchtitan's
``efsdp`` x ``ep`` (``torchtitan/distributed/parallel_dims.py``): the ep ranks of one
expert-parallel group are consecutive data-parallel ranks, and ``dp`` is the flattened
``(edp, ep)``, over which FSDP shards the dense parameters (and the data is split).

With context parallelism or HSDP (``cp > 1`` or ``dp_replicate > 1``) the mesh is
torchtitan's ``(pp, dp_replicate, dp_shard, cp, tp)`` (``ParallelDims``), built as two
views of the same ranks: the root ``(pp, dp_replicate, dp_shard_cp, tp)``, whose
``dp_shard_cp`` is the group FSDP shards over (cp folded into it: the cp ranks hold the
same parameters), and its ``_unflatten`` into ``dp_shard`` x ``cp``. ``mesh["fsdp"]`` is
the mesh the gradients are reduced over: ``dp_shard_cp``, or under HSDP the 2-D
``(dp_replicate, dp_shard_cp)`` that ``fully_shard`` takes for hybrid sharding
(reduce-scatter inside a replica, all-reduce across replicas). ``mesh["dp"]`` is the
data-parallel group the batch is split over, ``dp_replicate`` x ``dp_shard`` flattened;
``mesh["cp"]`` the ranks that split each sequence. Rank order (tp fastest):
``rank = (((pp·R + replica)·S + shard)·cp + c)·tp + t``. The K/V all-gathers of context
parallelism run on a process group of their own (``mesh.cp_group``, the ranks of
``mesh["cp"]``): where dp = 1 the mesh gives ``cp`` and ``dp_shard_cp`` one and the same
group (the ranks are the same), and the comm meter tells the two dims apart by group.

torch deprecates slicing a flattened dim from its root mesh (2.11 onwards): the caller
keeps the flattened mesh itself. :class:`RunMesh` does that bookkeeping, so ``mesh["dp"]``
is the same whichever way the mesh was built.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


class RunMesh:
    """A :class:`DeviceMesh` and the dims it flattened, indexed by name (``mesh["dp"]``)."""

    def __init__(self, root: DeviceMesh, flattened: dict[str, DeviceMesh] | None = None,
                 cp_group: Any = None) -> None:
        self.root = root
        self.flattened = dict(flattened or {})
        self.cp_group = cp_group

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        """The root's dims and the flattened ones."""
        return tuple(self.root.mesh_dim_names or ()) + tuple(self.flattened)

    @property
    def device_type(self) -> str:
        """``cpu`` or ``cuda``."""
        return self.root.device_type

    def __getitem__(self, name: str | tuple[str, ...]) -> Any:
        """The sub-mesh of dim ``name`` (1-D), or of the root's dims ``name`` (a tuple)."""
        if isinstance(name, str) and name in self.flattened:
            return self.flattened[name]
        return self.root[name]


def make_mesh(device_type: str, pp: int, dp: int, tp: int, ep: int = 1,
              experts: bool = False, cp: int = 1, dp_replicate: int = 1) -> RunMesh:
    """The run's mesh (module docstring); the default process group must have
    ``pp * dp * cp * tp`` ranks, ``ep`` divide ``dp`` (``dp / dp_replicate`` under HSDP)
    and ``dp_replicate`` divide dp. ``experts``: the expert dims even with ep = 1 (experts
    split over tp need the ``(ep, tp)`` dims): ``(pp, edp, ep, tp)``, or with cp or HSDP
    the views of :func:`_expert_views`."""
    if cp > 1 or dp_replicate > 1:
        run = _cp_mesh(device_type, pp, dp_replicate, dp // dp_replicate, cp, tp)
        if ep > 1 or experts:
            run.flattened |= _expert_views(device_type, pp, dp_replicate,
                                           dp // dp_replicate, ep, cp, tp)
        return run
    if ep == 1 and not experts:
        return RunMesh(init_device_mesh(device_type, (pp, dp, tp),
                                        mesh_dim_names=("pp", "dp", "tp")))
    root = init_device_mesh(device_type, (pp, dp // ep, ep, tp),
                            mesh_dim_names=("pp", "edp", "ep", "tp"))
    return RunMesh(root, {"dp": root["edp", "ep"]._flatten("dp")})


def _expert_views(device_type: str, pp: int, replicas: int, shard: int, ep: int, cp: int,
                  tp: int) -> dict[str, DeviceMesh]:
    """The experts' dims beside a context-parallel or HSDP mesh: the ep ranks are
    consecutive ``dp_shard`` ranks (shard = edp·ep + e, ep innermost, as without cp), so
    one expert-parallel group holds the same cp rank and tp rank; an expert is replicated
    over the other dp_shard ranks and the cp ranks (``edp``: (dp_shard/ep)·cp ranks,
    the group FSDP shards the experts over; Megatron-Core's expert data parallel without
    parallel folding) and, under HSDP, over the replicas. Built as one more mesh of the
    same ranks in another order, ``(pp, dp_replicate, edp, ep, tp)``: ``experts_fsdp`` is
    its ``edp`` dim, or the 2-D ``(dp_replicate, edp)`` under HSDP (``fully_shard``'s hybrid
    form), ``ep`` and ``ep_tp`` the expert-parallel (and expert tensor-parallel) dims."""
    ranks = torch.arange(pp * replicas * shard * cp * tp).view(
        pp, replicas, shard // ep, ep, cp, tp)
    order = ranks.permute(0, 1, 2, 4, 3, 5).reshape(pp, replicas, shard // ep * cp, ep, tp)
    names = ("pp", "dp_replicate", "edp", "ep", "tp")
    experts = DeviceMesh(device_type, order, mesh_dim_names=names)
    fsdp = experts["dp_replicate", "edp"] if replicas > 1 else experts["edp"]
    return {"ep": experts["ep"], "edp": experts["edp"], "experts_fsdp": fsdp,
            "ep_tp": experts["ep", "tp"]}


def _cp_mesh(device_type: str, pp: int, replicas: int, shard: int, cp: int,
             tp: int) -> RunMesh:
    """``(pp, dp_replicate, dp_shard, cp, tp)`` as the root ``(pp, dp_replicate,
    dp_shard_cp, tp)`` and its unflattened view (module docstring)."""
    root = init_device_mesh(device_type, (pp, replicas, shard * cp, tp),
                            mesh_dim_names=("pp", "dp_replicate", "dp_shard_cp", "tp"))
    full = root._unflatten("dp_shard_cp", (shard, cp), ("dp_shard", "cp"))
    fsdp = root["dp_replicate", "dp_shard_cp"] if replicas > 1 else root["dp_shard_cp"]
    own = None
    if cp > 1:  # every rank makes every cp group, in the same order (new_group's rule)
        for start in range(0, pp * replicas * shard * cp * tp, cp * tp):
            for t in range(tp):
                ranks = [start + c * tp + t for c in range(cp)]
                group = dist.new_group(ranks)
                if dist.get_rank() in ranks:
                    own = group
    return RunMesh(root, {"dp": full["dp_replicate", "dp_shard"]._flatten("dp"),
                          "dp_shard": full["dp_shard"], "cp": full["cp"], "fsdp": fsdp},
                   own)
