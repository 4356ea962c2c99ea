"""K virtual devices training the LM together: data x tensor x pipeline x expert parallel,
ZeRO 0-3.

Device (d, s, t) is data-parallel replica d, pipeline stage s, tensor-parallel rank t;
its global id is (d·pp + s)·tp + t. Every device holds its own tensors; all they
exchange goes through :class:`~shardlab.sim.virtual_group.VirtualGroup` collectives, which
count every byte under a kind: ``tp`` (inside a stage), ``pp`` (between stages),
``embedding`` (a tied head's gradient, first and last stage), ``dp`` (gradients and
ZeRO's gathers), ``ep`` (a MoE layer's tokens to and from their experts).

Expert parallelism draws its groups from the replicas, ep innermost: replica
d = g·ep + j is member j of ep group g and holds experts j·E/ep .. (j+1)·E/ep - 1 of
each MoE layer; the expert_dp = dp/ep replicas d ≡ j (mod ep) hold the same experts and
reduce (and ZeRO-shard) their gradients among themselves, while dense parameters
reduce over all dp replicas. The replicas of an ep group run each micro-batch's stage
together (:func:`~shardlab.sim.stage.stage_forward`), as their all-to-alls require.

One step, as Megatron-LM and DeepSpeed run it:

1. the global batch splits into dp replicas of m micro-batches; every rank divides its
   summed token loss by the number of real tokens in the *whole* global batch;
2. each replica runs the micro-batches through its stages in the order of a
   pipeline schedule from :mod:`shardlab.schedules` (activations forward and their
   gradients back by send/recv);
3. gradients: sequence-parallel partial ones all-reduced over tp, a tied embedding's
   two copies all-reduced, then over dp (routed experts over expert_dp): all-reduce
   (ZeRO 0), or reduce-scatter so each rank keeps its 1/dp shard (ZeRO 1-3);
4. AdamW on what each rank owns (all of it, or its flat shard), then ZeRO 1-2
   all-gather the updated parameters; ZeRO-3 keeps only its shard and gathers the
   weights for every micro-batch's forward and again for its backward (here by
   running the forward again in backward: the bytes and the memory are ZeRO-3's).

State bytes per device (weights, gradients and AdamW's two moments held after a
step) are counted from the tensors each device really keeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from shardlab.config.hardware import Link
from shardlab.config.model import ModelShape
from shardlab.nn.data import Batch
from shardlab.nn.moe import MoEOptions
from shardlab.schedules.generators import build
from shardlab.schedules.simulate import simulate as time_schedule
from shardlab.sim.device import Bucket, Device, buckets_of
from shardlab.sim.ledger import Ledger
from shardlab.sim.moe import CountLog, ExpertGroups
from shardlab.sim.shard import is_expert, replicated_under_sp, shard, unshard
from shardlab.sim.stage import Context, Params, Stage, make_context, stage_forward, stages_of
from shardlab.sim.virtual_group import VirtualGroup


@dataclass(frozen=True)
class Parallel:
    """The layout the simulator runs: degrees, ZeRO stage, sequence parallel, schedule, and
    the expert-parallel degree (ep divides dp; experts stay whole on every tensor rank)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    sp: bool = False
    microbatches: int = 1
    schedule: str = "1f1b"
    ep: int = 1

    @property
    def expert_dp(self) -> int:
        """Replicas holding the same experts: dp / ep."""
        return self.dp // self.ep


@dataclass(frozen=True)
class AdamWConfig:
    """AdamW hyper-parameters (Loshchilov & Hutter 2019), the same for the reference."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    # Adam divides by sqrt(v) + eps: for gradients near zero it magnifies the ~1e-7 fp32
    # rounding of differently ordered sums by up to |g|/eps. With 1e-8 a correct layout's
    # parameters drift ~5e-5 of their scale from one device's in 5 steps (measured); with
    # 1e-6 about 1e-6, inside the 1e-5 check. float64 runs are exact either way.
    eps: float = 1e-6
    weight_decay: float = 0.1

    def make(self, params: list[torch.Tensor]) -> torch.optim.AdamW:
        """torch's AdamW, single-tensor path, so flat shards and whole tensors do the same
        arithmetic element by element."""
        return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps,
                                 weight_decay=self.weight_decay, foreach=False)


DEFAULT_ADAMW = AdamWConfig()


class Simulator:
    """dp x tp x pp virtual devices holding a copy or a shard of ``model_params``
    (``moe``: the options of a MoE model's layers, as the one-device model has them)."""

    def __init__(self, shape: ModelShape, model_params: Params, par: Parallel,
                 opt: AdamWConfig = DEFAULT_ADAMW, ledger: Ledger | None = None,
                 link: Link | None = None, moe: MoEOptions | None = None) -> None:
        self.shape, self.par, self.opt, self.link = shape, par, opt, link
        self.moe = moe or MoEOptions()
        self.ledger = ledger or Ledger()
        self.dtype = next(iter(model_params.values())).dtype
        self.stages = stages_of(shape, par.pp)
        names = list(model_params)
        dp, tp, pp, ep = par.dp, par.tp, par.pp, par.ep
        self.tp_groups = {(d, s): self.group([self.rank(d, s, t) for t in range(tp)], "tp")
                          for d in range(dp) for s in range(pp)}
        self.dp_groups = {(s, t): self.group([self.rank(d, s, t) for d in range(dp)], "dp")
                          for s in range(pp) for t in range(tp)}
        # Replica d = g·ep + j: member j of ep group g; the replicas d ≡ j (mod ep) hold
        # the same experts (their expert_dp group).
        self.ep_groups = {(g, s, t): self.group([self.rank(g * ep + j, s, t)
                                                 for j in range(ep)], "ep")
                          for g in range(par.expert_dp) for s in range(pp) for t in range(tp)}
        self.expert_dp_groups = {(j, s, t): self.group([self.rank(j + ep * g, s, t)
                                                        for g in range(par.expert_dp)], "dp")
                                 for j in range(ep) for s in range(pp) for t in range(tp)}
        self.routed: dict[tuple[int, int, int], CountLog] = {}
        self.devices: dict[int, Device] = {}
        for d in range(dp):
            for st in self.stages:
                local = st.param_names(shape, names, pp)
                for t in range(tp):
                    full = {n: model_params["embed.weight" if n == "lm_head.weight"
                                            and "lm_head.weight" not in model_params else n]
                            for n in local}
                    dev = self._make_device(d, st.index, t, local, full)
                    self.devices[dev.rank] = dev
        timing = time_schedule(build(par.schedule, pp, par.microbatches))
        # The schedule's actions in an order every dependency allows: by start time.
        self.order = [e.action for e in sorted((e for ev in timing.events for e in ev),
                                               key=lambda e: (e.start, e.rank))]

    def group(self, ranks: list[int], kind: str) -> VirtualGroup:
        """A group of devices whose traffic is recorded under ``kind``, timed on the link."""
        return VirtualGroup(ranks, self.ledger, kind, self.link)

    def rank(self, d: int, s: int, t: int) -> int:
        """Global id of device (replica d, stage s, tensor rank t)."""
        return (d * self.par.pp + s) * self.par.tp + t

    def bucket_group(self, dev: Device, bucket: Bucket) -> tuple[VirtualGroup, int]:
        """The data-parallel group a bucket of ``dev`` reduces over, and dev's position in
        it: all dp replicas for dense parameters, the expert_dp ones for routed experts."""
        if bucket.experts:
            ep = self.par.ep
            return self.expert_dp_groups[(dev.d % ep, dev.s, dev.t)], dev.d // ep
        return self.dp_groups[(dev.s, dev.t)], dev.d

    def _make_device(self, d: int, s: int, t: int, names: list[str], full: Params) -> Device:
        local = {n: shard(n, full[n], t, self.par.tp, d % self.par.ep, self.par.ep)
                 for n in names}
        dev = Device(self.rank(d, s, t), d, s, t, names, {n: v.shape for n, v in local.items()},
                     buckets_of(names))
        if self.par.zero == 0:
            dev.params = {n: v.requires_grad_() for n, v in local.items()}
            dev.optimizer = self.opt.make(list(dev.params.values()))
            return dev
        for b in dev.buckets:
            group, pos = self.bucket_group(dev, b)
            flat = dev.flatten(local, b.names)
            dev.shards.append(flat.tensor_split(group.size)[pos].clone().requires_grad_())
        dev.optimizer = self.opt.make(dev.shards)
        if self.par.zero < 3:
            dev.params = {n: v.clone().requires_grad_() for n, v in local.items()}
        return dev

    def _bucket_groups(self, stage: int | None = None
                       ) -> Iterator[tuple[VirtualGroup, list[Device], int]]:
        """Every (data-parallel group, its devices, bucket index) to reduce or gather over,
        of one stage or of all: dense buckets over dp, routed experts over expert_dp."""
        for groups, b in ((self.dp_groups, 0), (self.expert_dp_groups, 1)):
            for key, group in groups.items():
                devs = [self.devices[r] for r in group.ranks]
                if (stage is None or key[-2] == stage) and b < len(devs[0].buckets):
                    yield group, devs, b

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

    def _params(self, s: int, grad: bool) -> list[list[Params]]:
        """Per replica, every tensor rank's parameters of stage s (ZeRO-3: one all-gather of
        each bucket's flat shards per data-parallel group, shared by its replicas, as a
        real gather is)."""
        par = self.par
        if par.zero < 3:
            return [[self.devices[self.rank(d, s, t)].params for t in range(par.tp)]
                    for d in range(par.dp)]
        out: list[list[Params]] = [[{} for _ in range(par.tp)] for _ in range(par.dp)]
        for group, devs, b in self._bucket_groups(s):
            flats = group.all_gather([dv.shards[b].detach() for dv in devs])
            for dv, flat in zip(devs, flats, strict=True):
                out[dv.d][dv.t].update({n: v.clone().requires_grad_(grad) for n, v in
                                        dv.unflatten(flat, dv.buckets[b].names).items()})
        return out

    def _run(self, micro: list[list[Batch]], tokens: int) -> float:
        """Every replica's micro-batches through the stages, in the schedule's order; the
        replicas advance in lock step, as data-parallel ranks do, those of one ep group
        together."""
        par, last = self.par, self.par.pp - 1
        saved: dict[tuple[int, int, int], tuple] = {}
        sent: dict[tuple[str, int, int, int], list[torch.Tensor]] = {}
        loss = 0.0
        for kind, s, i in self.order:
            st = self.stages[s]
            redo = kind != "F" and par.zero == 3  # gather again and redo the forward
            params = self._params(s, grad=par.zero < 3 or redo) if kind == "F" or redo else None
            for g in range(par.expert_dp):
                ds = [g * par.ep + j for j in range(par.ep)]
                mbs = [micro[d][i] for d in ds]
                ctxs = [stage_context(self, d, s, mb.pad_mask, log=kind == "F")
                        for d, mb in zip(ds, mbs, strict=True)]
                targets, masks = [mb.targets for mb in mbs], [mb.loss_mask for mb in mbs]
                if kind == "F":
                    inputs = [mb.input_ids if st.is_first else self._recv(sent, "F", d, s, i)
                              for d, mb in zip(ds, mbs, strict=True)]
                    with torch.set_grad_enabled(par.zero < 3):
                        outs = stage_forward(ctxs, st, [params[d] for d in ds], inputs,
                                             targets, masks)
                    for d, x, out in zip(ds, inputs, outs, strict=True):
                        saved[(d, s, i)] = (x, params[d], out)
                        if st.is_last:
                            loss += float(out[0].detach())
                        else:
                            sent[("F", d, s, i)] = self._send(d, s, s + 1, out)
                    continue
                inputs, pss, outs = zip(*(saved.pop((d, s, i)) for d in ds), strict=True)
                if redo:
                    pss = [params[d] for d in ds]
                    outs = stage_forward(ctxs, st, pss, list(inputs), targets, masks)
                if s == last:
                    # Every tensor rank holds the same loss; their sum's gradient is each
                    # rank's own gradient under Megatron's f/g operators (tp_ops).
                    torch.autograd.backward([torch.stack(out).sum() / tokens for out in outs])
                else:
                    torch.autograd.backward(
                        [y for out in outs for y in out],
                        [y for d in ds for y in self._recv(sent, "B", d, s, i)])
                for d, x, ps in zip(ds, inputs, pss, strict=True):
                    for t, p in enumerate(ps):
                        self.devices[self.rank(d, s, t)].accumulate(p)
                    if not st.is_first:
                        sent[("B", d, s, i)] = self._send(d, s, s - 1, [v.grad for v in x])
        return loss

    def _send(self, d: int, src: int, dst: int, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each tensor rank sends its tensor to the same tensor rank of stage ``dst``."""
        out = []
        for t, x in enumerate(xs):
            pair = self.group([self.rank(d, src, t), self.rank(d, dst, t)], "pp")
            out.append(pair.send(x.detach(), 0, 1))
        return out

    @staticmethod
    def _recv(sent: dict, kind: str, d: int, s: int, i: int) -> list[torch.Tensor]:
        """What stage s of replica d receives for micro-batch i: the previous stage's output
        (a new leaf whose gradient goes back), or the next stage's input gradient."""
        xs = sent.pop((kind, d, s - 1, i) if kind == "F" else (kind, d, s + 1, i))
        return [x.requires_grad_() for x in xs] if kind == "F" else xs

    # -- after the micro-batches ---------------------------------------------------------

    def _sync_gradients(self) -> None:
        par = self.par
        for dev in self.devices.values():  # a parameter no micro-batch touched gets zeros
            for n in dev.names:
                if n not in dev.grads:
                    dev.grads[n] = torch.zeros(dev.shapes[n], dtype=self.dtype)
        if par.sp and par.tp > 1:
            for group in self.tp_groups.values():
                devs = [self.devices[r] for r in group.ranks]
                names = [n for n in devs[0].names if replicated_under_sp(n)]
                if names:
                    flats = group.all_reduce([torch.cat([dv.grads[n].reshape(-1)
                                                         for n in names]) for dv in devs])
                    for dv, flat in zip(devs, flats, strict=True):
                        dv.set_grads(names, flat)
        if self.shape.tied and par.pp > 1:
            for d in range(par.dp):
                for t in range(par.tp):
                    a = self.devices[self.rank(d, 0, t)]
                    b = self.devices[self.rank(d, par.pp - 1, t)]
                    pair = self.group([a.rank, b.rank], "embedding")
                    ga, gb = pair.all_reduce([a.grads["embed.weight"], b.grads["lm_head.weight"]])
                    a.grads["embed.weight"], b.grads["lm_head.weight"] = ga, gb
        for group, devs, b in self._bucket_groups():
            names = devs[0].buckets[b].names
            flats = [dv.flatten(dv.grads, names) for dv in devs]
            if par.zero == 0:
                for dv, flat in zip(devs, group.all_reduce(flats), strict=True):
                    dv.set_grads(names, flat)
                continue
            for dv, g in zip(devs, group.reduce_scatter(flats), strict=True):
                if not dv.grad_shards:
                    dv.grad_shards = [torch.empty(0)] * len(dv.buckets)
                dv.grad_shards[b] = g
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
            for group, devs, b in self._bucket_groups():
                flats = group.all_gather([dv.shards[b].detach() for dv in devs])
                for dv, flat in zip(devs, flats, strict=True):
                    with torch.no_grad():
                        for n, v in dv.unflatten(flat, dv.buckets[b].names).items():
                            dv.params[n].copy_(v)

    # -- what the devices hold -----------------------------------------------------------

    def state_bytes(self) -> dict[int, dict[str, int]]:
        """Per device: bytes of weights, gradients and optimizer state it holds now."""
        el = torch.finfo(self.dtype).bits // 8
        return {dev.rank: dev.state_bytes(self.par.zero, el) for dev in self.devices.values()}

    def _local(self, dev: Device) -> Params:
        """Every local parameter of ``dev`` (ZeRO-3: gathered from its groups' shards
        without counting: a check)."""
        if self.par.zero < 3:
            return dev.params
        out: Params = {}
        for b in dev.buckets:
            group, _ = self.bucket_group(dev, b)
            i = dev.buckets.index(b)
            flat = torch.cat([self.devices[r].shards[i].detach() for r in group.ranks])
            out.update(dev.unflatten(flat, b.names))
        return out

    def full_params(self) -> Params:
        """The whole model as the first ep group holds it: tensor slices of replica 0, the
        experts of replicas 0..ep-1 (gathered without counting: a check)."""
        out: Params = {}
        for st in self.stages:
            tp_parts = [self._local(self.devices[self.rank(0, st.index, t)])
                        for t in range(self.par.tp)]
            ep_parts = [self._local(self.devices[self.rank(j, st.index, 0)])
                        for j in range(self.par.ep)]
            for n in tp_parts[0]:
                out[n] = unshard(n, [p[n] for p in (ep_parts if is_expert(n) else tp_parts)])
        return out


def stage_context(sim: Simulator, d: int, s: int, pad_mask: torch.Tensor,
                  log: bool = False) -> Context:
    """The context of stage s of replica d for a micro-batch's padding; for a MoE model
    with its ep groups, logging the router's counts into ``sim.routed`` when ``log``."""
    experts = None
    if sim.shape.moe is not None:
        g = d // sim.par.ep
        keys = [(g, s, t) for t in range(sim.par.tp)]
        experts = ExpertGroups(sim.moe, [sim.ep_groups[k] for k in keys],
                               [sim.routed[k] for k in keys] if log else None)
    return make_context(sim.shape, sim.tp_groups[(d, s)], sim.par.sp, pad_mask, sim.dtype,
                        experts)


__all__ = ["DEFAULT_ADAMW", "AdamWConfig", "Device", "Parallel", "Simulator", "Stage",
           "stage_context"]
