"""K virtual devices training the LM together: data x context x tensor x pipeline x expert
parallel, ZeRO 0-3 and HSDP.

Device (d, c, s, t) is data-parallel replica d, context-parallel rank c, pipeline stage s,
tensor-parallel rank t; lane l = d·cp + c runs the pipeline on its own tokens, and the
device's global id is (l·pp + s)·tp + t (:mod:`.parallel`). Every device holds its own
tensors; all they exchange goes through :class:`~shardlab.sim.virtual_group.VirtualGroup`
collectives, which count every byte under a kind: ``tp`` (inside a stage), ``cp`` (K and V
gathered over a replica's cp ranks, :mod:`.context_parallel`), ``pp`` (between stages),
``embedding`` (a tied head's gradient, first and last stage), ``dp`` (gradients and ZeRO's
gathers, :mod:`.data_parallel`), ``ep`` (a MoE layer's tokens to and from their experts).

Expert parallelism draws its groups from the replicas, ep innermost: replica
d = g·ep + j is member j of ep group g and holds experts j·E/ep .. (j+1)·E/ep - 1 of
each MoE layer; the expert_dp = dp/ep replicas d ≡ j (mod ep) hold the same experts and
reduce (and ZeRO-shard) their gradients among themselves, while dense parameters
reduce over all dp replicas. The replicas of an ep group run each micro-batch's stage
together (:func:`~shardlab.sim.stage.stage_forward`), as their all-to-alls require; so do
the cp ranks of a replica, for their all-gathers. (The simulator runs context parallel
on dense models only: a MoE layer's auxiliary losses and capacity are functions of the
tokens of one forward, which cp would split.)

One step, as Megatron-LM and DeepSpeed run it:

1. the global batch splits into dp replicas of m micro-batches, each micro-batch's
   tokens into the cp ranks' zigzag chunks; every rank divides its summed token loss by
   the number of real tokens in the *whole* global batch;
2. each lane runs the micro-batches through its stages in the order of a pipeline
   schedule from :mod:`shardlab.schedules` (activations forward and their gradients
   back by send/recv);
3. gradients: sequence-parallel partial ones all-reduced over tp, a tied embedding's
   two copies all-reduced, then over the dp x cp lanes (routed experts over expert_dp):
   all-reduce (ZeRO 0), or reduce-scatter so each rank keeps its shard (ZeRO 1-3), and
   under HSDP an all-reduce of the shard across the replicas;
4. AdamW on what each rank owns (all of it, or its flat shard), then ZeRO 1-2
   all-gather the updated parameters; ZeRO-3 keeps only its shard and gathers the
   weights for every micro-batch's forward and again for its backward (here by
   running the forward again in backward: the bytes and the memory are ZeRO-3's).

State bytes per device (weights, gradients and AdamW's two moments held after a
step) are counted from the tensors each device really keeps.
"""

from __future__ import annotations

import torch

from shardlab.config.hardware import Link
from shardlab.config.model import ModelShape
from shardlab.nn.data import Batch
from shardlab.nn.moe import MoEOptions
from shardlab.schedules.generators import build
from shardlab.schedules.simulate import simulate as time_schedule
from shardlab.sim.context_parallel import lane_tokens
from shardlab.sim.data_parallel import DataParallel
from shardlab.sim.device import Device, buckets_of
from shardlab.sim.ledger import Ledger
from shardlab.sim.moe import CountLog, ExpertGroups
from shardlab.sim.parallel import DEFAULT_ADAMW, AdamWConfig, Parallel
from shardlab.sim.shard import (
    is_expert,
    partial_over_heads,
    replicated_under_sp,
    shard,
    unshard,
)
from shardlab.sim.stage import Context, Params, Stage, make_context, stage_forward, stages_of
from shardlab.sim.virtual_group import VirtualGroup


class Simulator:
    """dp x cp x tp x pp virtual devices holding a copy or a shard of ``model_params``
    (``moe``: the options of a MoE model's layers, as the one-device model has them)."""

    def __init__(self, shape: ModelShape, model_params: Params, par: Parallel,
                 opt: AdamWConfig = DEFAULT_ADAMW, ledger: Ledger | None = None,
                 link: Link | None = None, moe: MoEOptions | None = None) -> None:
        self.shape, self.par, self.opt, self.link = shape, par, opt, link
        self.moe = moe or MoEOptions()
        self.ledger = ledger or Ledger()
        self.dtype = next(iter(model_params.values())).dtype
        self.stages = stages_of(shape, par.pp, par.stage_layers)
        names = list(model_params)
        tp, pp, ep, cp = par.tp, par.pp, par.ep, par.cp
        pairs = [(s, t) for s in range(pp) for t in range(tp)]
        self.tp_groups = {(lane, s): self.group([par.rank(lane, s, t) for t in range(tp)],
                                                "tp")
                          for lane in range(par.lanes) for s in range(pp)}
        self.cp_groups = {(d, s, t): self.group([par.rank(d * cp + c, s, t)
                                                 for c in range(cp)], "cp")
                          for d in range(par.dp) for s, t in pairs}
        # Replica d = g·ep + j: member j of ep group g (experts need cp = 1).
        self.ep_groups = {(g, s, t): self.group([par.rank((g * ep + j) * cp, s, t)
                                                 for j in range(ep)], "ep")
                          for g in range(par.expert_dp) for s, t in pairs}
        self.routed: dict[tuple[int, int, int], CountLog] = {}
        self.devices: dict[int, Device] = {}
        self.data = DataParallel(par, self.devices, self.group, moe=shape.moe is not None)
        for lane in range(par.lanes):
            for st in self.stages:
                local = st.param_names(shape, names, pp)
                for t in range(tp):
                    full = {n: model_params["embed.weight" if n == "lm_head.weight"
                                            and "lm_head.weight" not in model_params else n]
                            for n in local}
                    dev = self._make_device(lane, st.index, t, local, full)
                    self.devices[dev.rank] = dev
        # The lanes that run a stage together: a replica's cp ranks, or an ep group.
        self.units = ([[d * cp + c for c in range(cp)] for d in range(par.dp)] if cp > 1 else
                      [[g * ep + j for j in range(ep)] for g in range(par.expert_dp)])
        timing = time_schedule(build(par.schedule, pp, par.microbatches))
        # The schedule's actions in an order every dependency allows: by start time.
        self.order = [e.action for e in sorted((e for ev in timing.events for e in ev),
                                               key=lambda e: (e.start, e.rank))]

    def group(self, ranks: list[int], kind: str) -> VirtualGroup:
        """A group of devices whose traffic is recorded under ``kind``, timed on the link."""
        return VirtualGroup(ranks, self.ledger, kind, self.link)

    def rank(self, d: int, s: int, t: int, c: int = 0) -> int:
        """Global id of device (replica d, stage s, tensor rank t, cp rank c)."""
        return self.par.rank(d * self.par.cp + c, s, t)

    def _make_device(self, lane: int, s: int, t: int, names: list[str], full: Params) -> Device:
        par = self.par
        d, c = divmod(lane, par.cp)
        local = {n: shard(n, full[n], t, par.tp, d % par.ep, par.ep) for n in names}
        dev = Device(par.rank(lane, s, t), d, s, t, names,
                     {n: v.shape for n, v in local.items()}, buckets_of(names), c, lane)
        if par.zero == 0:
            dev.params = {n: v.requires_grad_() for n, v in local.items()}
            dev.optimizer = self.opt.make(list(dev.params.values()))
            return dev
        self.data.own_shards(dev, local)
        dev.optimizer = self.opt.make(dev.shards)
        if par.zero < 3:
            dev.params = {n: v.clone().requires_grad_() for n, v in local.items()}
        return dev

    # -- one step ----------------------------------------------------------------------

    def step(self, batch: Batch) -> float:
        """Train one step on ``batch`` (the global batch); return its loss (token mean)."""
        par = self.par
        for dev in self.devices.values():
            dev.grads = {}
        self.routed = {key: [] for key in self.ep_groups}
        micro = [part.split(par.microbatches) for part in batch.split(par.dp)]
        loss = self._run(micro, batch.real_tokens)
        self._sync_gradients()
        self._update()
        return loss / batch.real_tokens

    def _params(self, s: int, grad: bool) -> dict[int, list[Params]]:
        """Per lane, every tensor rank's parameters of stage s (ZeRO-3: gathered)."""
        if self.par.zero < 3:
            return {lane: [self.devices[self.par.rank(lane, s, t)].params
                           for t in range(self.par.tp)] for lane in range(self.par.lanes)}
        return self.data.gather_stage(s, grad)

    def _run(self, micro: list[list[Batch]], tokens: int) -> float:
        """Every lane's micro-batches through the stages, in the schedule's order; the lanes
        advance in lock step, as data-parallel ranks do, those of one unit together."""
        par, last, cp = self.par, self.par.pp - 1, self.par.cp
        saved: dict[tuple[int, int, int], tuple] = {}
        sent: dict[tuple[str, int, int, int], list[torch.Tensor]] = {}
        loss = 0.0
        for kind, s, i in self.order:
            st = self.stages[s]
            redo = kind != "F" and par.zero == 3  # gather again and redo the forward
            params = self._params(s, grad=par.zero < 3 or redo) if kind == "F" or redo else None
            for lanes in self.units:
                mbs = [micro[lane // cp][i] for lane in lanes]
                ctxs = [stage_context(self, lane, s, mb.pad_mask, log=kind == "F")
                        for lane, mb in zip(lanes, mbs, strict=True)]
                targets = [lane_tokens(mb.targets, c.positions, cp) for mb, c in
                           zip(mbs, ctxs, strict=True)]
                masks = [lane_tokens(mb.loss_mask, c.positions, cp) for mb, c in
                         zip(mbs, ctxs, strict=True)]
                if kind == "F":
                    inputs = [lane_tokens(mb.input_ids, c.positions, cp) if st.is_first
                              else self._recv(sent, "F", lane, s, i)
                              for lane, mb, c in zip(lanes, mbs, ctxs, strict=True)]
                    with torch.set_grad_enabled(par.zero < 3):
                        outs = stage_forward(ctxs, st, [params[lane] for lane in lanes],
                                             inputs, targets, masks)
                    for lane, x, out in zip(lanes, inputs, outs, strict=True):
                        saved[(lane, s, i)] = (x, params[lane], out)
                        if st.is_last:
                            loss += float(out[0].detach())
                        else:
                            sent[("F", lane, s, i)] = self._send(lane, s, s + 1, out)
                    continue
                inputs, pss, outs = zip(*(saved.pop((lane, s, i)) for lane in lanes),
                                        strict=True)
                if redo:
                    pss = [params[lane] for lane in lanes]
                    outs = stage_forward(ctxs, st, pss, list(inputs), targets, masks)
                if s == last:
                    # Every tensor rank holds the same loss; their sum's gradient is each
                    # rank's own gradient under Megatron's f/g operators (tp_ops).
                    torch.autograd.backward([torch.stack(out).sum() / tokens for out in outs])
                else:
                    torch.autograd.backward(
                        [y for out in outs for y in out],
                        [y for lane in lanes for y in self._recv(sent, "B", lane, s, i)])
                for lane, x, ps in zip(lanes, inputs, pss, strict=True):
                    for t, p in enumerate(ps):
                        self.devices[par.rank(lane, s, t)].accumulate(p)
                    if not st.is_first:
                        sent[("B", lane, s, i)] = self._send(lane, s, s - 1,
                                                             [v.grad for v in x])
        return loss

    def _send(self, lane: int, src: int, dst: int, xs: list[torch.Tensor]
              ) -> list[torch.Tensor]:
        """Each tensor rank sends its tensor to the same tensor rank of stage ``dst``."""
        out = []
        for t, x in enumerate(xs):
            pair = self.group([self.par.rank(lane, src, t), self.par.rank(lane, dst, t)], "pp")
            out.append(pair.send(x.detach(), 0, 1))
        return out

    @staticmethod
    def _recv(sent: dict, kind: str, lane: int, s: int, i: int) -> list[torch.Tensor]:
        """What stage s of ``lane`` receives for micro-batch i: the previous stage's output
        (a new leaf whose gradient goes back), or the next stage's input gradient."""
        xs = sent.pop((kind, lane, s - 1, i) if kind == "F" else (kind, lane, s + 1, i))
        return [x.requires_grad_() for x in xs] if kind == "F" else xs

    # -- after the micro-batches ---------------------------------------------------------

    def _sync_gradients(self) -> None:
        par = self.par
        for dev in self.devices.values():  # a parameter no micro-batch touched gets zeros
            for n in dev.names:
                if n not in dev.grads:
                    dev.grads[n] = torch.zeros(dev.shapes[n], dtype=self.dtype)
        if par.tp > 1:
            for group in self.tp_groups.values():
                devs = [self.devices[r] for r in group.ranks]
                names = [n for n in devs[0].names
                         if (par.sp and replicated_under_sp(n)) or partial_over_heads(n)]
                if names:
                    flats = group.all_reduce([torch.cat([dv.grads[n].reshape(-1)
                                                         for n in names]) for dv in devs])
                    for dv, flat in zip(devs, flats, strict=True):
                        dv.set_grads(names, flat)
        if self.shape.tied and par.pp > 1:
            for lane in range(par.lanes):
                for t in range(par.tp):
                    a = self.devices[par.rank(lane, 0, t)]
                    b = self.devices[par.rank(lane, par.pp - 1, t)]
                    pair = self.group([a.rank, b.rank], "embedding")
                    ga, gb = pair.all_reduce([a.grads["embed.weight"], b.grads["lm_head.weight"]])
                    a.grads["embed.weight"], b.grads["lm_head.weight"] = ga, gb
        self.data.reduce()
        if par.zero >= 2:  # ZeRO-2/3 keep only their gradient shards
            for dev in self.devices.values():
                dev.grads = {}

    def _update(self) -> None:
        par = self.par
        for dev in self.devices.values():
            if par.zero == 0:
                for n, p in dev.params.items():
                    p.grad = dev.grads[n]
            else:
                for shard_, g in zip(dev.shards, dev.grad_shards, strict=True):
                    shard_.grad = g
                dev.grad_shards = []
            dev.optimizer.step()
            dev.optimizer.zero_grad(set_to_none=True)
        if par.zero in (1, 2):
            self.data.gather_updated()

    # -- what the devices hold -----------------------------------------------------------

    def state_bytes(self) -> dict[int, dict[str, int]]:
        """Per device: bytes of weights, gradients and optimizer state it holds now."""
        el = torch.finfo(self.dtype).bits // 8
        return {dev.rank: dev.state_bytes(self.par.zero, el) for dev in self.devices.values()}

    def full_params(self) -> Params:
        """The whole model as the first ep group holds it: tensor slices of lane 0, the
        experts of replicas 0..ep-1 (gathered without counting: a check)."""
        out: Params = {}
        for st in self.stages:
            tp_parts = [self.data.local(self.devices[self.rank(0, st.index, t)])
                        for t in range(self.par.tp)]
            ep_parts = [self.data.local(self.devices[self.rank(j, st.index, 0)])
                        for j in range(self.par.ep)]
            for n in tp_parts[0]:
                out[n] = unshard(n, [p[n] for p in (ep_parts if is_expert(n) else tp_parts)])
        return out


def stage_context(sim: Simulator, lane: int, s: int, pad_mask: torch.Tensor,
                  log: bool = False) -> Context:
    """The context of stage s of ``lane`` for a micro-batch's padding: a MoE model's ep
    groups, logging the router's counts into ``sim.routed`` when ``log``; the cp groups
    of the lane's replica and its cp rank."""
    par = sim.par
    d, c = divmod(lane, par.cp)
    experts = None
    if sim.shape.moe is not None:
        g = d // par.ep
        keys = [(g, s, t) for t in range(par.tp)]
        experts = ExpertGroups(sim.moe, [sim.ep_groups[k] for k in keys],
                               [sim.routed[k] for k in keys] if log else None)
    cp = [sim.cp_groups[(d, s, t)] for t in range(par.tp)] if par.cp > 1 else None
    return make_context(sim.shape, sim.tp_groups[(lane, s)], par.sp, pad_mask, sim.dtype,
                        experts, cp, c)


__all__ = ["DEFAULT_ADAMW", "AdamWConfig", "Device", "Parallel", "Simulator", "Stage",
           "stage_context"]
