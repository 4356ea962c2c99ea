"""K virtual devices training the LM together: data x tensor x pipeline parallel, ZeRO 0-3.

Device (d, s, t) is data-parallel replica d, pipeline stage s, tensor-parallel rank t;
its global id is (d·pp + s)·tp + t. Every device holds its own tensors; all they
exchange goes through :class:`~shardlab.sim.virtual_group.VirtualGroup` collectives, which
count every byte under a kind: ``tp`` (inside a stage), ``pp`` (between stages),
``embedding`` (a tied head's gradient, first and last stage), ``dp`` (gradients and
ZeRO's gathers).

One step, as Megatron-LM and DeepSpeed run it:

1. the global batch splits into dp replicas of m micro-batches; every rank divides its
   summed token loss by the number of real tokens in the *whole* global batch;
2. each replica runs the micro-batches through its stages in the order of a
   pipeline schedule from :mod:`shardlab.schedules` (activations forward and their
   gradients back by send/recv);
3. gradients: sequence-parallel partial ones all-reduced over tp, a tied embedding's
   two copies all-reduced, then over dp: all-reduce (ZeRO 0), or reduce-scatter so
   each rank keeps its 1/dp shard (ZeRO 1-3);
4. AdamW on what each rank owns (all of it, or its flat shard), then ZeRO 1-2
   all-gather the updated parameters; ZeRO-3 keeps only its shard and gathers the
   weights for every micro-batch's forward and again for its backward (here by
   running the forward again in backward: the bytes and the memory are ZeRO-3's).

State bytes per device (weights, gradients and AdamW's two moments held after a
step) are counted from the tensors each device really keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shardlab.config.hardware import Link
from shardlab.config.model import ModelShape
from shardlab.nn.data import Batch
from shardlab.schedules.generators import build
from shardlab.schedules.simulate import simulate as time_schedule
from shardlab.sim.ledger import Ledger
from shardlab.sim.shard import replicated_under_sp, shard, unshard
from shardlab.sim.stage import Context, Params, Stage, make_context, stage_forward, stages_of
from shardlab.sim.virtual_group import VirtualGroup


@dataclass(frozen=True)
class Parallel:
    """The layout the simulator runs: degrees, ZeRO stage, sequence parallel, schedule."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    sp: bool = False
    microbatches: int = 1
    schedule: str = "1f1b"


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


@dataclass
class Device:
    """What one virtual device holds."""

    rank: int
    names: list[str]
    shapes: dict[str, torch.Size]
    params: Params = field(default_factory=dict)  # whole local tensors (ZeRO 0-2)
    shard: torch.Tensor | None = None  # this device's flat slice (ZeRO 1-3)
    grads: Params = field(default_factory=dict)  # accumulated over micro-batches
    grad_shard: torch.Tensor | None = None
    optimizer: torch.optim.Optimizer | None = None

    def numel(self) -> int:
        """Elements of every local parameter (this device's slice of the model)."""
        return sum(s.numel() for s in self.shapes.values())

    def flatten(self, tensors: Params) -> torch.Tensor:
        """Concatenate ``tensors`` in this device's name order."""
        return torch.cat([tensors[n].reshape(-1) for n in self.names])

    def unflatten(self, flat: torch.Tensor) -> Params:
        """Split a flat tensor back into named local tensors."""
        out, i = {}, 0
        for n in self.names:
            k = self.shapes[n].numel()
            out[n] = flat[i:i + k].view(self.shapes[n])
            i += k
        return out


class Simulator:
    """dp x tp x pp virtual devices holding a copy or a shard of ``model_params``."""

    def __init__(self, shape: ModelShape, model_params: Params, par: Parallel,
                 opt: AdamWConfig = DEFAULT_ADAMW, ledger: Ledger | None = None,
                 link: Link | None = None) -> None:
        self.shape, self.par, self.opt, self.link = shape, par, opt, link
        self.ledger = ledger or Ledger()
        self.dtype = next(iter(model_params.values())).dtype
        self.stages = stages_of(shape, par.pp)
        names = list(model_params)
        dp, tp, pp = par.dp, par.tp, par.pp
        self.tp_groups = {(d, s): self.group([self.rank(d, s, t) for t in range(tp)], "tp")
                          for d in range(dp) for s in range(pp)}
        self.dp_groups = {(s, t): self.group([self.rank(d, s, t) for d in range(dp)], "dp")
                          for s in range(pp) for t in range(tp)}
        self.devices: dict[int, Device] = {}
        for d in range(dp):
            for st in self.stages:
                local = st.param_names(shape, names, pp)
                for t in range(tp):
                    full = {n: model_params["embed.weight" if n == "lm_head.weight"
                                            and "lm_head.weight" not in model_params else n]
                            for n in local}
                    dev = self._make_device(self.rank(d, st.index, t), local, full, t)
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

    def _make_device(self, rank: int, names: list[str], full: Params, t: int) -> Device:
        local = {n: shard(n, full[n], t, self.par.tp) for n in names}
        dev = Device(rank, names, {n: v.shape for n, v in local.items()})
        if self.par.zero == 0:
            dev.params = {n: v.requires_grad_() for n, v in local.items()}
            dev.optimizer = self.opt.make(list(dev.params.values()))
            return dev
        d = (rank // self.par.tp) // self.par.pp
        flat = dev.flatten(local)
        dev.shard = flat.tensor_split(self.par.dp)[d].clone().requires_grad_()
        dev.optimizer = self.opt.make([dev.shard])
        if self.par.zero < 3:
            dev.params = {n: v.clone().requires_grad_() for n, v in local.items()}
        return dev

    # -- one step ----------------------------------------------------------------------

    def step(self, batch: Batch) -> float:
        """Train one step on ``batch`` (the global batch); return its loss (token mean)."""
        par = self.par
        for dev in self.devices.values():
            dev.grads = {}
        micro = [part.split(par.microbatches) for part in batch.split(par.dp)]
        loss = self._run(micro, batch.real_tokens)
        self._sync_gradients()
        self._update()
        return loss / batch.real_tokens

    def _params(self, s: int, grad: bool) -> list[list[Params]]:
        """Per replica, every tensor rank's parameters of stage s (ZeRO-3: one all-gather of
        the flat shards per tensor rank, shared by all replicas, as a real gather is)."""
        par = self.par
        if par.zero < 3:
            return [[self.devices[self.rank(d, s, t)].params for t in range(par.tp)]
                    for d in range(par.dp)]
        out: list[list[Params]] = [[] for _ in range(par.dp)]
        for t in range(par.tp):
            group = self.dp_groups[(s, t)]
            devs = [self.devices[r] for r in group.ranks]
            flats = group.all_gather([dv.shard.detach() for dv in devs])
            for d, (dv, flat) in enumerate(zip(devs, flats, strict=True)):
                out[d].append({n: v.clone().requires_grad_(grad)
                               for n, v in dv.unflatten(flat).items()})
        return out

    def _run(self, micro: list[list[Batch]], tokens: int) -> float:
        """Every replica's micro-batches through the stages, in the schedule's order; the
        replicas advance in lock step, as data-parallel ranks do."""
        par, last = self.par, self.par.pp - 1
        saved: dict[tuple[int, int, int], tuple] = {}
        sent: dict[tuple[str, int, int, int], list[torch.Tensor]] = {}
        loss = 0.0
        for kind, s, i in self.order:
            st = self.stages[s]
            redo = kind != "F" and par.zero == 3  # gather again and redo the forward
            params = self._params(s, grad=par.zero < 3 or redo) if kind == "F" or redo else None
            for d in range(par.dp):
                mb = micro[d][i]
                ctx = stage_context(self, d, s, mb.pad_mask)
                if kind == "F":
                    inputs = mb.input_ids if st.is_first else self._recv(sent, "F", d, s, i)
                    with torch.set_grad_enabled(par.zero < 3):
                        out = stage_forward(ctx, st, params[d], inputs, mb.targets,
                                            mb.loss_mask)
                    saved[(d, s, i)] = (inputs, params[d], out)
                    if st.is_last:
                        loss += float(out[0].detach())
                    else:
                        sent[("F", d, s, i)] = self._send(d, s, s + 1, out)
                    continue
                inputs, ps, out = saved.pop((d, s, i))
                if redo:
                    ps = params[d]
                    out = stage_forward(ctx, st, ps, inputs, mb.targets, mb.loss_mask)
                if s == last:
                    # Every tensor rank holds the same loss; their sum's gradient is each
                    # rank's own gradient under Megatron's f/g operators (tp_ops).
                    torch.autograd.backward(torch.stack(out).sum() / tokens)
                else:
                    torch.autograd.backward(out, self._recv(sent, "B", d, s, i))
                self._harvest(d, s, ps)
                if not st.is_first:
                    sent[("B", d, s, i)] = self._send(d, s, s - 1, [x.grad for x in inputs])
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

    def _harvest(self, d: int, s: int, ps: list[Params]) -> None:
        """Add this micro-batch's parameter gradients to each device's accumulator."""
        for t, p in enumerate(ps):
            dev = self.devices[self.rank(d, s, t)]
            for n, v in p.items():
                if v.grad is None:
                    continue
                g = v.grad
                dev.grads[n] = dev.grads[n] + g if n in dev.grads else g.clone()
                v.grad = None

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
                        self._scatter_into(dv, names, flat)
        if self.shape.tied and par.pp > 1:
            for d in range(par.dp):
                for t in range(par.tp):
                    a = self.devices[self.rank(d, 0, t)]
                    b = self.devices[self.rank(d, par.pp - 1, t)]
                    pair = self.group([a.rank, b.rank], "embedding")
                    ga, gb = pair.all_reduce([a.grads["embed.weight"], b.grads["lm_head.weight"]])
                    a.grads["embed.weight"], b.grads["lm_head.weight"] = ga, gb
        for group in self.dp_groups.values():
            devs = [self.devices[r] for r in group.ranks]
            flats = [dv.flatten(dv.grads) for dv in devs]
            if par.zero == 0:
                for dv, flat in zip(devs, group.all_reduce(flats), strict=True):
                    self._scatter_into(dv, dv.names, flat)
            else:
                for dv, g in zip(devs, group.reduce_scatter(flats), strict=True):
                    dv.grad_shard = g
                    if par.zero >= 2:  # ZeRO-2/3 keep only their gradient shard
                        dv.grads = {}

    @staticmethod
    def _scatter_into(dev: Device, names: list[str], flat: torch.Tensor) -> None:
        i = 0
        for n in names:
            k = dev.shapes[n].numel()
            dev.grads[n] = flat[i:i + k].view(dev.shapes[n]).clone()
            i += k

    def _update(self) -> None:
        par = self.par
        for dev in self.devices.values():
            if par.zero == 0:
                for n, p in dev.params.items():
                    p.grad = dev.grads[n]
            else:
                dev.shard.grad = dev.grad_shard
            dev.optimizer.step()
            dev.optimizer.zero_grad(set_to_none=True)
        if par.zero in (1, 2):
            for group in self.dp_groups.values():
                devs = [self.devices[r] for r in group.ranks]
                for dv, flat in zip(devs, group.all_gather([dv.shard.detach() for dv in devs]),
                                    strict=True):
                    with torch.no_grad():
                        for n, v in dv.unflatten(flat).items():
                            dv.params[n].copy_(v)

    # -- what the devices hold -----------------------------------------------------------

    def state_bytes(self) -> dict[int, dict[str, int]]:
        """Per device: bytes of weights, gradients and optimizer state it holds now."""
        out = {}
        for dev in self.devices.values():
            el = torch.finfo(self.dtype).bits // 8
            own = dev.shard.numel() if dev.shard is not None else dev.numel()
            weights = own if self.par.zero >= 3 else dev.numel()
            grads = own if self.par.zero >= 2 else dev.numel()
            moments = sum(v.numel() for st in dev.optimizer.state.values()
                          for k, v in st.items() if k in ("exp_avg", "exp_avg_sq"))
            out[dev.rank] = {"weights": weights * el, "gradients": grads * el,
                             "optimizer": moments * el}
        return out

    def full_params(self) -> Params:
        """The whole model as replica 0 holds it (gathered without counting: a check)."""
        out: Params = {}
        for st in self.stages:
            devs = [self.devices[self.rank(0, st.index, t)] for t in range(self.par.tp)]
            if self.par.zero == 3:
                local = []
                for t, dv in enumerate(devs):
                    peers = [self.devices[r] for r in self.dp_groups[(st.index, t)].ranks]
                    local.append(dv.unflatten(torch.cat([p.shard.detach() for p in peers])))
            else:
                local = [dv.params for dv in devs]
            for n in devs[0].names:
                out[n] = unshard(n, [p[n] for p in local])
        return out


def stage_context(sim: Simulator, d: int, s: int, pad_mask: torch.Tensor) -> Context:
    """The context of stage s of replica d for a micro-batch's padding."""
    return make_context(sim.shape, sim.tp_groups[(d, s)], sim.par.sp, pad_mask, sim.dtype)


__all__ = ["DEFAULT_ADAMW", "AdamWConfig", "Device", "Parallel", "Simulator", "Stage",
           "stage_context"]
