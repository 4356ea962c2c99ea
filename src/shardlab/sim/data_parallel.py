"""Data parallelism over the lanes: gradients summed, ZeRO's shards kept, HSDP's replicas.

Every lane (replica d, context-parallel rank c; :mod:`.parallel`) holds its stage's
parameters and computes their gradients on its own tokens, so a gradient is the sum over
the dp x cp lanes. The dense parameters of a device fall in one bucket, a MoE model's
routed experts in a second (:mod:`.device`); each bucket is reduced, and under ZeRO
sharded, over its own group (kind ``dp``):

* dense, the *shard group*: the lanes of one HSDP replica, replicas
  d = rep·dp_shard + k for k < dp_shard with every cp rank c, the device at position
  k·cp + c (cp folded into FSDP's shard group, as torchtitan's ``dp_shard_cp`` mesh
  does; without HSDP, all dp x cp lanes);
* dense under HSDP (dp_replicate R > 1), the *replica group*: the R lanes at the same
  position of every replica, which all-reduce the gradient shard each has after the
  reduce-scatter (FSDP2's ``HSDP``: reduce-scatter inside a shard group, all-reduce
  across replicas), so every replica applies the same update to the same shard;
* routed experts (cp = 1): the expert_dp = dp/ep replicas d ≡ j (mod ep) holding the
  same experts, the device at position d // ep (every replica when ep = 1; under HSDP
  too, where the cost model counts the same: no replica group for experts).

ZeRO 0 all-reduces each bucket; ZeRO 1-3 reduce-scatter it, so each device keeps chunk
``position`` of the flat bucket (``torch.tensor_split`` of it, the cost model's
:func:`~shardlab.estimate.comm.ring_chunks`); ZeRO 1-2 all-gather the updated weights
after the step, ZeRO-3 gathers them for every forward and again for every backward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from shardlab.sim.device import Bucket, Device
from shardlab.sim.parallel import Parallel
from shardlab.sim.virtual_group import VirtualGroup

Params = dict[str, torch.Tensor]
GroupMaker = Callable[[list[int], str], VirtualGroup]


@dataclass(frozen=True)
class Slot:
    """Where a device's bucket is reduced: its shard group and position in it, and under
    HSDP its replica group and replica (None and 0 without)."""

    group: VirtualGroup
    position: int
    replicas: VirtualGroup | None = None
    replica: int = 0


class DataParallel:
    """The data-parallel groups of every device (module docstring) and what runs over them."""

    def __init__(self, par: Parallel, devices: dict[int, Device], group: GroupMaker,
                 moe: bool = False) -> None:
        self.par, self.devices = par, devices
        cp, k_max, ep = par.cp, par.dp_shard, par.ep

        def lane(d: int, c: int = 0) -> int:
            return d * cp + c

        pairs = [(s, t) for s in range(par.pp) for t in range(par.tp)]
        self.shard = {(rep, s, t): group([par.rank(lane(rep * k_max + k, c), s, t)
                                          for k in range(k_max) for c in range(cp)], "dp")
                      for rep in range(par.dp_replicate) for s, t in pairs}
        self.replicas = {} if par.dp_replicate == 1 else {
            (k, c, s, t): group([par.rank(lane(rep * k_max + k, c), s, t)
                                 for rep in range(par.dp_replicate)], "dp")
            for k in range(k_max) for c in range(cp) for s, t in pairs}
        # A MoE model's routed experts reduce over expert_dp, all of dp when ep = 1 (they
        # were left out of every reduction then, until 2026-12-07).
        self.experts = {} if not moe else {
            (j, s, t): group([par.rank(lane(j + ep * g), s, t) for g in range(par.expert_dp)],
                             "dp")
            for j in range(ep) for s, t in pairs}

    def slot(self, dev: Device, bucket: Bucket) -> Slot:
        """The groups ``dev`` reduces ``bucket`` over, and its places in them."""
        par = self.par
        if bucket.experts:
            return Slot(self.experts[(dev.d % par.ep, dev.s, dev.t)], dev.d // par.ep)
        rep, k = divmod(dev.d, par.dp_shard)
        replicas = self.replicas.get((k, dev.c, dev.s, dev.t))
        return Slot(self.shard[(rep, dev.s, dev.t)], k * par.cp + dev.c, replicas, rep)

    def buckets(self, stage: int | None = None) -> Iterator[tuple[VirtualGroup, list[Device],
                                                                  int]]:
        """Every (shard group, its devices in group order, bucket index) of one stage or of
        all: dense buckets over their shard groups, routed experts over expert_dp."""
        for groups, b in ((self.shard, 0), (self.experts, 1)):
            for key, group in groups.items():
                devs = [self.devices[r] for r in group.ranks]
                if (stage is None or key[-2] == stage) and b < len(devs[0].buckets):
                    yield group, devs, b

    def own_shards(self, dev: Device, local: Params) -> None:
        """ZeRO 1-3: give ``dev`` its chunk of each flat bucket of ``local`` (a leaf the
        optimizer steps)."""
        for b in dev.buckets:
            slot = self.slot(dev, b)
            flat = dev.flatten(local, b.names)
            dev.shards.append(flat.tensor_split(slot.group.size)[slot.position].clone()
                              .requires_grad_())

    def reduce(self) -> None:
        """Sum every bucket's gradients over its lanes: all-reduce (ZeRO 0), or
        reduce-scatter into each device's ``grad_shards`` and, under HSDP, all-reduce each
        shard across the replicas."""
        zero = self.par.zero
        for group, devs, b in self.buckets():
            names = devs[0].buckets[b].names
            flats = [dv.flatten(dv.grads, names) for dv in devs]
            if zero == 0:
                for dv, flat in zip(devs, group.all_reduce(flats), strict=True):
                    dv.set_grads(names, flat)
                continue
            for dv, g in zip(devs, group.reduce_scatter(flats), strict=True):
                if not dv.grad_shards:
                    dv.grad_shards = [torch.empty(0)] * len(dv.buckets)
                dv.grad_shards[b] = g
        for group in self.replicas.values():  # HSDP: dense buckets only (no ep with it)
            devs = [self.devices[r] for r in group.ranks]
            for dv, g in zip(devs, group.all_reduce([dv.grad_shards[0] for dv in devs]),
                             strict=True):
                dv.grad_shards[0] = g

    def gather_stage(self, s: int, grad: bool) -> dict[int, list[Params]]:
        """ZeRO-3: every lane's tensor ranks' parameters of stage s, one all-gather of each
        bucket's flat shards per shard group, shared by its lanes as a real gather is."""
        par = self.par
        out: dict[int, list[Params]] = {lane: [{} for _ in range(par.tp)]
                                        for lane in range(par.lanes)}
        for group, devs, b in self.buckets(s):
            flats = group.all_gather([dv.shards[b].detach() for dv in devs])
            for dv, flat in zip(devs, flats, strict=True):
                out[dv.lane][dv.t].update({n: v.clone().requires_grad_(grad) for n, v in
                                           dv.unflatten(flat, dv.buckets[b].names).items()})
        return out

    def gather_updated(self) -> None:
        """ZeRO 1-2: every device's whole weights again from the updated shards."""
        for group, devs, b in self.buckets():
            flats = group.all_gather([dv.shards[b].detach() for dv in devs])
            for dv, flat in zip(devs, flats, strict=True):
                with torch.no_grad():
                    for n, v in dv.unflatten(flat, dv.buckets[b].names).items():
                        dv.params[n].copy_(v)

    def local(self, dev: Device) -> Params:
        """Every local parameter of ``dev`` (ZeRO-3: joined from its shard group's shards
        without counting: a check)."""
        if self.par.zero < 3:
            return dev.params
        out: Params = {}
        for i, b in enumerate(dev.buckets):
            group = self.slot(dev, b).group
            flat = torch.cat([self.devices[r].shards[i].detach() for r in group.ranks])
            out.update(dev.unflatten(flat, b.names))
        return out
