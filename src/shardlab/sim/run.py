"""Run a simulated layout beside one device, and hold both to each other and to the cost model.

Checks, each with its tolerance:

* ``loss``: largest relative difference of the per-step losses from one device's;
* ``params``: largest difference of any parameter after the last step, relative to the
  largest parameter magnitude (fp32: 1e-5; float64: 1e-12);
* ``comm.<kind>``: bytes each device sent in every step (``tp``, ``pp``, ``embedding``,
  ``dp``) against :mod:`shardlab.estimate.comm` for the same layout and the same
  device: exact, tolerance 0, also when the group does not divide a buffer (the
  ring's chunks and ZeRO's flat shards are then of unequal length, and the cost model
  gives each rank its own figure, ``rank=``); the dense parameters reduce over the
  dp x cp lanes (with HSDP: inside a replica, then across replicas), a MoE model's
  routed experts over expert_dp = dp/ep, each its own buffer
  (:func:`shardlab.estimate.context.grad_sync_bytes`,
  :func:`shardlab.estimate.partition.layout_params_split`); uneven stages hold the
  layers the layout gives them;
* ``comm.cp`` (context parallel): the K/V all-gathers and their reverse reduce-scatters
  each device sent against :func:`shardlab.estimate.context.cp_bytes_per_stage`: exact;
* ``comm.ep`` (MoE): the all-to-all bytes each device sent in every step against
  :func:`shardlab.estimate.expert.expert_alltoall_bytes` given the counts the routers
  of the device's ep group really produced in that step: exact;
* ``state``: bytes of weights, gradients and AdamW moments each device holds against
  ZeRO's rule on the flat shards it owns (:func:`predicted_state`), exact.

A MoE model's one-device reference runs each global batch as the dp x m micro-batches
the replicas run (:class:`~shardlab.sim.reference.Reference`): the load-balancing loss
and the capacity are functions of the tokens of one forward.

The alpha-beta seconds of every device are reported beside the bytes, not checked.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.hardware import Link
from shardlab.config.layout import Layout, make_layout
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.estimate.comm import (
    embedding_sync_bytes,
    pp_bytes_per_rank,
    ring_chunks,
    tp_bytes_per_stage,
)
from shardlab.estimate.context import (
    cp_bytes_per_stage,
    grad_sync_bytes,
    local_layout,
    shard_group,
)
from shardlab.estimate.expert import expert_alltoall_bytes
from shardlab.estimate.memory import zero_state_bytes
from shardlab.estimate.partition import layout_params_split
from shardlab.nn.data import Batch
from shardlab.nn.model import TransformerLM
from shardlab.nn.moe import MoEOptions
from shardlab.sim.engine import Simulator
from shardlab.sim.ledger import Ledger
from shardlab.sim.moe import CountLog
from shardlab.sim.parallel import DEFAULT_ADAMW, AdamWConfig, Parallel
from shardlab.sim.reference import Reference

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
KINDS = ("tp", "cp", "pp", "embedding", "dp", "ep")

Progress = Callable[[int, str], None]
"""Told what a run has just finished: the steps done so far, and one line saying what
(the model built, the devices placed, a step's losses) and how many seconds it took."""


@dataclass
class Check:
    """One check: its value, its tolerance, whether it passed."""

    name: str
    value: float
    tolerance: float

    @property
    def passed(self) -> bool:
        """value <= tolerance."""
        return self.value <= self.tolerance


@dataclass
class Result:
    """Everything a simulated run measured, and its checks."""

    layout: Layout
    losses: list[float]
    reference_losses: list[float]
    max_param_diff: float
    max_loss_diff: float
    comm: dict[str, dict[str, list[float]]]
    state_bytes: list[dict[str, Any]]
    checks: list[Check] = field(default_factory=list)
    routing_imbalance: float | None = None  # MoE: max/mean expert load, last step

    @property
    def passed(self) -> bool:
        """Every check passed."""
        return all(c.passed for c in self.checks)


def layout_for(shape: ModelShape, par: Parallel, global_batch: int, seq: int,
               dtype: torch.dtype, capacity_factor: float = 0.0) -> Layout:
    """The cost model's Layout of a simulated run (validates it: SpecError if it is wrong).

    The simulator's ZeRO-3 runs each stage's forward again in backward (to gather the
    weights a second time), which the cost model sees as full recompute. A MoE model's
    experts are whole on every tensor rank (etp = 1), and its tokens whole on every
    tensor rank (no sequence parallelism); it runs without context parallelism and
    without HSDP (:mod:`shardlab.sim.engine`, :mod:`shardlab.sim.data_parallel`).
    """
    if shape.moe is not None and par.sp:
        raise SpecError("sp", int(par.sp), "the simulator's MoE layers route whole sequences on "
                        "every tensor rank: run them without sequence parallelism")
    if shape.moe is not None and par.cp > 1:
        raise SpecError("cp", par.cp, "the simulator runs context parallel on dense models "
                        "only (a MoE layer's aux loss and capacity depend on the tokens of one "
                        "forward, which cp splits)")
    if par.ep > 1 and par.dp_replicate > 1:
        raise SpecError("dp_replicate", par.dp_replicate, "the simulator runs HSDP without "
                        "expert parallelism (ep = 1)")
    return make_layout(shape, dp=par.dp, tp=par.tp, pp=par.pp, zero=par.zero, sp=par.sp,
                       micro_batch=global_batch // (par.dp * par.microbatches),
                       global_batch=global_batch, seq=seq,
                       recompute="full" if par.zero == 3 else "none",
                       dtype="fp64" if dtype == torch.float64 else "fp32",
                       schedule=par.schedule, ep=par.ep,
                       etp=1 if shape.moe is not None else None,
                       capacity_factor=capacity_factor, cp=par.cp,
                       stage_layers=par.stage_layers, dp_replicate=par.dp_replicate)


def predicted_bytes(shape: ModelShape, lay: Layout, stage: int, d: int = 0, t: int = 0,
                    routed: CountLog | None = None, c: int = 0) -> dict[str, float]:
    """Bytes the cost model says device (replica d, cp rank c, stage, tensor rank t) sends
    per step, by kind: each rank's own share of the ring's chunks (exact, not the mean over
    ranks); ``routed``: the router counts of its ep group in the step, for ``ep``. A cp
    rank's tensor- and pipeline-parallel bytes are those of its s/cp tokens
    (:func:`~shardlab.estimate.context.local_layout`); its gradients go over dp x cp
    (:func:`~shardlab.estimate.context.grad_sync_bytes`)."""
    dense, experts = layout_params_split(shape, lay, vocab_parallel=False)[stage]
    rep, k = divmod(d, lay.dp_shard)
    dp = grad_sync_bytes(dense, lay.dtype, lay, k * lay.cp + c, rep)
    if experts:
        dp += grad_sync_bytes(experts, lay.dtype, lay, d // lay.ep, group=lay.expert_dp,
                              replicas=1)
    local = local_layout(lay)
    ends = stage in (0, lay.pp - 1)
    return {"tp": tp_bytes_per_stage(shape, local, vocab_parallel=False, rank=t)[stage],
            "cp": cp_bytes_per_stage(shape, lay)[stage],
            "pp": pp_bytes_per_rank(shape, local, split_by_tp=lay.sp)[stage],
            # A ring of two: each end sends the whole gradient once, exactly.
            "embedding": embedding_sync_bytes(shape, lay, vocab_parallel=False) if ends else 0.0,
            "dp": dp,
            "ep": expert_alltoall_bytes(shape, lay, routed or [], ep_rank=d % lay.ep)}


def predicted_state(psi: int, policy: DtypePolicy, zero: int, group: int, position: int,
                    experts: int = 0, expert_group: int = 1, expert_position: int = 0
                    ) -> dict[str, int]:
    """Bytes of weights, gradients and AdamW moments a device holds: ZeRO's rule of
    :func:`~shardlab.estimate.memory.zero_state_bytes` (stage 1 shards the moments, 2 the
    gradients too, 3 the weights too) on the flat shard the device really owns, chunk
    ``position`` of :func:`~shardlab.estimate.comm.ring_chunks` over its shard ``group``
    (exact, not psi/group; the group is dp_shard x cp). A MoE rank's ``experts``
    routed-expert parameters are a second buffer, sharded over ``expert_group`` = dp/ep
    (its chunk ``expert_position``); ``psi`` is then the dense rest."""
    out = {"weights": 0, "gradients": 0, "optimizer": 0}
    for n, p, i in ((psi, group, position), (experts, expert_group, expert_position)):
        if not n:
            continue
        whole = zero_state_bytes(n, policy, 0, p)
        own = zero_state_bytes(ring_chunks(n, p)[i], policy, 0, p)
        out["weights"] += int((own if zero >= 3 else whole).weights)
        out["gradients"] += int((own if zero >= 2 else whole).gradients)
        out["optimizer"] += int((own if zero >= 1 else whole).optimizer)
    return out


def imbalance(logs: list[CountLog]) -> float | None:
    """The router's largest max/mean expert load over the MoE-layer forwards of ``logs``
    (each expert's load summed over the members of its ep group); None without MoE."""
    worst = None
    for log in logs:
        for matrix in log:
            load = [sum(col) for col in zip(*matrix, strict=True)]
            mean = sum(load) / len(load)
            worst = max(worst or 0.0, max(load) / mean)
    return worst


def _rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tied: bool) -> float:
    scale = max(float(v.abs().max()) for v in b.values())
    worst = 0.0
    for n, ref in b.items():
        worst = max(worst, float((a[n] - ref).abs().max()))
        if tied and n == "embed.weight" and "lm_head.weight" in a:  # the last stage's copy
            worst = max(worst, float((a["lm_head.weight"] - ref).abs().max()))
    return worst / scale


def simulate_run(shape: ModelShape, par: Parallel, batches: Iterable[Batch],
                 dtype: torch.dtype = torch.float32, seed: int = 0,
                 opt: AdamWConfig = DEFAULT_ADAMW, link: Link | None = None,
                 progress: Progress | None = None, moe: MoEOptions | None = None) -> Result:
    """Train one step per batch of ``batches`` (read as the steps go, so a long run holds
    one at a time) on one device and on the simulated layout; compare. ``progress``, when
    given, hears of each phase and step as it ends; ``moe``: a MoE model's options."""
    stream = iter(batches)
    first = next(stream, None)
    if first is None:
        raise ValueError("simulate_run needs at least one batch")
    seq = first.seq
    moe = moe or MoEOptions()
    lay = layout_for(shape, par, first.size, seq, dtype, moe.capacity_factor)
    tell = progress or (lambda _steps, _line: None)
    clock = time.perf_counter()

    def lap() -> float:
        nonlocal clock
        now = time.perf_counter()
        spent, clock = now - clock, now
        return spent

    model = TransformerLM(shape, dtype=dtype, seed=seed, moe_options=moe)
    n_params = sum(p.numel() for p in model.parameters())
    tell(0, f"model built: {n_params:,} parameters ({lap():.1f} s)")
    ledger = Ledger()
    sim = Simulator(shape, {n: p.detach() for n, p in model.named_parameters()}, par, opt,
                    ledger, link, moe)
    ref = Reference(model, opt, par.dp * par.microbatches if shape.moe is not None else 1)
    tell(0, f"placed on {lay.gpus} virtual devices ({lap():.1f} s)")
    losses, ref_losses = [], []
    place = {r: par.place(r) for r in sim.devices}  # (d, c, s, t) of each global rank
    counted: dict[str, list[list[float]]] = {k: [] for k in KINDS}
    predicted: list[dict[int, dict[str, float]]] = []
    for i, batch in enumerate(itertools.chain([first], stream)):
        ledger.reset()
        losses.append(sim.step(batch))
        ref_losses.append(ref.step(batch))
        for k in KINDS:
            counted[k].append([float(ledger.sent(r, k)) for r in sorted(sim.devices)])
        # Routing changes every step, so the cost model is asked about each step's counts.
        predicted.append({r: predicted_bytes(shape, lay, s, d, t,
                                             sim.routed.get((d // par.ep, s, t)), c)
                          for r, (d, c, s, t) in place.items()})
        tell(i + 1, f"loss {losses[-1]:.6f}, one device {ref_losses[-1]:.6f} ({lap():.1f} s)")
    seconds = {k: [ledger.seconds(r, k) for r in sorted(sim.devices)] for k in KINDS}
    comm = {k: {"counted_bytes": counted[k][-1],
                "predicted_bytes": [float(predicted[-1][r][k]) for r in sorted(sim.devices)],
                "seconds": seconds[k]}
            for k in KINDS}
    checks = [Check("loss", max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses,
                                                                     strict=True)),
                    TOLERANCE[dtype]),
              Check("params", _rel_diff(sim.full_params(), ref.params(), shape.tied),
                    TOLERANCE[dtype])]
    for k in KINDS:
        if (k == "ep" and shape.moe is None) or (k == "cp" and par.cp == 1):
            continue
        worst = max(abs(c - pred[r][k]) for step, pred in zip(counted[k], predicted, strict=True)
                    for c, r in zip(step, sorted(sim.devices), strict=True))
        checks.append(Check(f"comm.{k}", worst, 0.0))
    states = []
    params_per_stage = layout_params_split(shape, lay, vocab_parallel=False)
    worst_state = 0.0
    for r, held in sim.state_bytes().items():
        d, c, s, _ = place[r]
        dense, experts = params_per_stage[s]
        state = predicted_state(dense, lay.dtype, par.zero, shard_group(lay),
                                d % lay.dp_shard * lay.cp + c, experts, lay.expert_dp,
                                d // lay.ep)
        states.append({"rank": r, "counted": held, "predicted": state})
        worst_state = max(worst_state, *(abs(held[k] - state[k]) for k in state))
    checks.append(Check("state", worst_state, 0.0))
    return Result(lay, losses, ref_losses, checks[1].value, checks[0].value, comm, states,
                  checks, imbalance(list(sim.routed.values())))
