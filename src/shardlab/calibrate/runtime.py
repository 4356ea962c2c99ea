"""What a training step on this machine costs besides its arithmetic, measured with real ranks.

``shardlab hardware --measure`` adds this to the stored CPU measurement (``runtime`` in
``cpu.json``). It starts ``world`` one-thread ranks through
:func:`shardlab.distributed.launch.launch` (gloo on loopback, the same launcher
``shardlab train`` uses) and times two things:

* **collectives**: ``all_reduce``, ``all_gather`` (into one tensor), ``reduce_scatter``
  (from one tensor) and a point-to-point ``send``/``recv`` of 16 KiB to 4 MiB, best of
  several calls each. Each is fitted by least squares, every size weighted alike
  (relative error), to the ring formulas of :mod:`shardlab.plan.comm_time`:
  all-reduce 2(p-1)α + 2(p-1)/p·n/B, gather and scatter (p-1)α + (p-1)/p·n/B (n the
  whole, gathered buffer), send α + n/B (Thakur, Rabenseifner & Gropp 2005). gloo's
  rates differ by collective (its all-gather and reduce-scatter on loopback move a byte
  1.5-3x slower than its all-reduce), so each keeps its own α and B, not one link speed.
* **the runtime's fixed costs per step** (``overheads``): ``shardlab train`` itself
  (:func:`shardlab.train.loop.train_rank`) on a tiny model (d = 16, 8 tokens per sequence,
  so the arithmetic is microseconds and what is left is Python, autograd, hooks,
  DTensor dispatch, the optimizer's per-tensor work, the schedule and the collectives'
  latency), for each parallel style the planner prices differently: ``ddp`` (the
  eager base), ``fsdp`` (FSDP2, ZeRO-3), ``tp`` (DTensor tensor parallel) and ``pp``
  (torch pipelining, 1F1B), each at 4 points (1 and 4 layers per rank L, 1 and 2
  micro-batches m per step, a pipeline 2 and 4) fitted to
  ``per_step + L·per_layer_step + m·(per_microbatch + L·per_layer)``
  (:class:`Overhead`). A step's time is its slowest rank's; the fastest step from the
  fourth on counts.

These are what :func:`shardlab.plan.step_time.step_seconds` adds for "this machine"
(the ``overhead`` part, and the collectives at their own rates, latency excluded since
the tiny runs already hold it). The fitted figures' types and their reading are
vocabulary (:mod:`shardlab.config.runtime`).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from shardlab.calibrate.budget import Phases
from shardlab.calibrate.cpu import DEFAULT_SECONDS, measure_cpu
from shardlab.config.model import ModelShape
from shardlab.config.runtime import COLLECTIVES, STYLES, Overhead
from shardlab.distributed.launch import launch
from shardlab.errors import SpecError
from shardlab.plan.comm_time import allreduce_seconds, gather_seconds, send_seconds
from shardlab.train.config import TrainConfig
from shardlab.train.loop import train_rank

SIZES = (2**14, 2**16, 2**18, 2**20, 2**22)
"""Bytes of the timed buffers (the gathered / reduced whole)."""


TINY = {"d_model": 16, "heads": 4, "seq": 8, "vocab": 64}
"""The tiny model of the overhead runs: arithmetic in microseconds, every operator kept."""

STEPS = 6
"""Steps per overhead run."""

LAYERS = (1, 4)
"""Layers per rank of the overhead runs. With 1 and 2 the per-layer terms came from one
layer's difference, and a model of 4 (the demo's) extrapolated that noise twice over:
eight measurements on the 2-core AMD EPYC (2026-12-07) put ddp's fixed cost at 4 layers
and one micro-batch at 8.9-21.2 ms with 1 and 2, 7.4-11.7 ms with 1 and 4 (fsdp 47-80
against 37-56 ms, pp 18-37 against 12-28 ms), the runs taking as long."""

COLLECTIVE_SECONDS = 3.0
"""The collectives' share of the 2-rank phase (s), split evenly over collective and size."""

MAX_CALLS = 20
"""Most timed calls of one collective at one size."""

RUNTIME_SECONDS = 15.0
"""The budget of the 2-rank phase (s): its collectives take :data:`COLLECTIVE_SECONDS`;
the rest is two interpreters starting torch and the 16 tiny training runs, fixed work on
a d = 16 model that no CPU feature makes slow (13 s measured on a 2-core machine)."""

FIRST_TIMED = 3
"""The first step timed: past FSDP's lazy init (0), DDP's bucket rebuild (1) and the step
``shardlab train`` measures FLOPs and bytes in (2)."""






# -- fitting (no torch) ------------------------------------------------------------------------


def ring_terms(name: str, nbytes: float, p: int) -> tuple[float, float]:
    """(coefficient of α, bytes over B) of collective ``name`` on p ranks and n bytes: the
    planner's own ring formulas (:mod:`shardlab.plan.comm_time`) at α = 1, B = ∞ and at
    α = 0, B = 1, so the fit and the planner price a collective the same way."""
    if name not in COLLECTIVES:
        raise SpecError("collective", name, f"must be one of {', '.join(COLLECTIVES)}")
    if name == "send":
        return float(send_seconds(nbytes, 1.0, math.inf)), float(send_seconds(nbytes, 0.0, 1.0))
    ring = allreduce_seconds if name == "all_reduce" else gather_seconds
    return float(ring(nbytes, p, 1.0, math.inf)), float(ring(nbytes, p, 0.0, 1.0))


def fit_collective(name: str, p: int, samples: list[tuple[float, float]]
                   ) -> tuple[float, float]:
    """(α seconds, B bytes/s) of ``name`` from (bytes, seconds) samples, least squares on
    the relative error: minimise Σ((a·α + x/B - t)/t)². α and 1/B are kept >= 0."""
    if len(samples) < 2:
        raise SpecError("samples", len(samples), "needs at least 2 sizes to fit α and B")
    rows = [ring_terms(name, n, p) for n, _ in samples]
    t = np.array([s for _, s in samples], float)
    a = np.array([[ca / ti, x / ti] for (ca, x), ti in zip(rows, t, strict=True)])
    (alpha, inv_b), *_ = np.linalg.lstsq(a, np.ones(len(t)), rcond=None)
    if inv_b <= 0:  # latency-bound throughout: the largest size gives the bandwidth
        inv_b = t[-1] / rows[-1][1]
        alpha = 0.0
    if alpha < 0:  # bandwidth-bound throughout: refit the bandwidth alone
        alpha = 0.0
        x = np.array([r[1] for r in rows])
        inv_b = float(np.sum(x / t) / np.sum((x / t) ** 2))
    return float(alpha), float(1.0 / inv_b)


def solve_overhead(points: list[tuple[int, int, float]]) -> Overhead:
    """The :class:`Overhead` through (layers L, micro-batches m, seconds) points: least
    squares for s + L·k + m·b + m·L·l, no term negative (a negative one, which only noise
    gives, is set to 0 and the others refitted)."""
    a = np.array([[1.0, layers, m, m * layers] for layers, m, _ in points])
    y = np.array([s for _, _, s in points])
    keep = np.ones(4, bool)
    coef = np.zeros(4)
    while keep.any():
        coef = np.zeros(4)
        coef[keep] = np.linalg.lstsq(a[:, keep], y, rcond=None)[0]
        if (coef >= 0).all():
            break
        keep &= coef > 0
    return Overhead(*(float(max(c, 0.0)) for c in coef))


# -- the configurations of the overhead runs ---------------------------------------------------


def overhead_points(style: str, world: int) -> list[tuple[int, int, dict[str, Any]]]:
    """(layers per rank, micro-batches, ``TrainConfig`` fields) of ``style``'s four runs:
    :data:`LAYERS` per rank, times 1 and 2 micro-batches (a pipeline: ``world`` and twice
    that, since 1F1B needs at least one per stage)."""
    base: dict[str, Any] = {"dp": 1, "tp": 1, "pp": 1, "dp_mode": "fsdp"}
    if style == "ddp":
        base.update(dp=world, dp_mode="ddp")
    elif style == "fsdp":
        base.update(dp=world, dp_mode="fsdp")
    elif style == "tp":
        base.update(tp=world)
    elif style == "pp":
        base.update(pp=world, schedule="1f1b")
    else:
        raise SpecError("style", style, f"must be one of {', '.join(STYLES)}")
    low = world if style == "pp" else 1
    share = 2 * low  # sequences per data-parallel rank and step
    return [(layers, m, {**base, "layers": layers * base["pp"], "global_batch": share * base["dp"],
                         "micro_batch": share // m})
            for layers in LAYERS for m in (low, 2 * low)]


# -- the measurement (torch, inside the ranks) -------------------------------------------------


def _call(name: str, rank: int, whole: Any, part: Any) -> None:
    """One call of collective ``name``: ``whole`` is the gathered / reduced buffer."""
    if name == "all_reduce":
        dist.all_reduce(whole)
    elif name == "all_gather":
        dist.all_gather_into_tensor(whole, part)
    elif name == "reduce_scatter":
        dist.reduce_scatter_tensor(part, whole)
    elif rank == 0:  # send: rank 0 to rank 1, the others wait at the next barrier
        dist.send(whole, 1)
    elif rank == 1:
        dist.recv(whole, 0)


def _time_collectives(ctx: Any, budget: float) -> dict[str, list[tuple[float, float]]]:
    """Best seconds of each collective at each size in :data:`SIZES` (rank 0's view), each
    (collective, size) for an equal share of ``budget`` seconds: one warm-up call, then
    calls while the share lasts (at least 2, at most :data:`MAX_CALLS`). Rank 0 decides
    when to stop and tells the others, so every rank makes the same calls."""
    share = budget / (len(SIZES) * len(COLLECTIVES))
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in COLLECTIVES}
    go = torch.ones(1)
    for nbytes in SIZES:
        whole = torch.ones(nbytes // 4)
        part = torch.ones(nbytes // 4 // ctx.world_size)
        for name in COLLECTIVES:
            best, calls, start = math.inf, 0, time.perf_counter()
            while True:
                dist.barrier()
                t0 = time.perf_counter()
                _call(name, ctx.rank, whole, part)
                if calls:  # the first call is a warm-up
                    best = min(best, time.perf_counter() - t0)
                calls += 1
                go.fill_(float(calls < 3 or (calls <= MAX_CALLS
                                             and time.perf_counter() - start < share)))
                dist.broadcast(go, 0)
                if not go.item():
                    break
            out[name].append((float(nbytes), best))
    return out


def _overhead_runs(ctx: Any, world: int) -> dict[str, list[tuple[int, int, float]]]:
    """Each style's three (layers per rank, micro-batches, seconds per step) points."""
    rng = random.Random(0)
    docs = [[rng.randrange(TINY["vocab"]) for _ in range(TINY["seq"] + 1)] for _ in range(64)]
    out: dict[str, list[tuple[int, int, float]]] = {}
    for style in STYLES:
        points = []
        for layers_per_rank, m, fields in overhead_points(style, world):
            layers = fields.pop("layers")
            shape = ModelShape("tiny", layers, TINY["d_model"], TINY["heads"], TINY["vocab"],
                               TINY["seq"], style="llama", tied=False)
            cfg = TrainConfig(shape=shape, seq=TINY["seq"], steps=STEPS, warmup=1, docs=docs,
                              **fields)
            mine = train_rank(ctx, cfg)["step_seconds"]
            every: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(every, mine)
            # A step lasts as long as its slowest rank; the fastest such step counts (other
            # jobs on the machine can only slow a step, never speed it up).
            slowest = [max(r[i] for r in every) for i in range(FIRST_TIMED, STEPS)]
            points.append((layers_per_rank, m, min(slowest)))
        out[style] = points
    return out


def _runtime_rank(ctx: Any, world: int) -> dict[str, Any]:
    """One rank of :func:`measure_runtime`: one thread, collectives, then the tiny runs."""
    torch.set_num_threads(1)
    collectives = _time_collectives(ctx, COLLECTIVE_SECONDS)
    overheads = _overhead_runs(ctx, world)
    return {"collectives": collectives, "overheads": overheads}


def measure_runtime(world: int = 2, timeout_s: float = 120.0) -> dict[str, Any]:
    """Start ``world`` one-thread gloo ranks and measure; return the JSON-ready ``runtime``
    section of ``cpu.json`` (fitted figures plus the raw samples they came from)."""
    if world < 2:
        raise SpecError("world", world, "must be >= 2 (collectives need two ranks)")
    raw = launch("shardlab.calibrate.runtime:_runtime_rank", world, (world,),
                 timeout_s=timeout_s, threads=1)[0]
    return runtime_document(world, raw)


def measure_machine(seconds: float | None = None, threads: int | None = None,
                    runtime: bool = True, phases: Phases | None = None) -> dict[str, Any]:
    """:func:`shardlab.calibrate.cpu.measure_cpu` (``seconds`` its budget, default
    :data:`~shardlab.calibrate.cpu.DEFAULT_SECONDS`) plus, with ``runtime``, the ``runtime``
    section measured at 2 ranks as one more phase (the document ``shardlab hardware
    --measure`` stores). ``phases`` records and shows every phase."""
    log = phases if phases is not None else Phases()
    doc = measure_cpu(seconds=DEFAULT_SECONDS if seconds is None else seconds,
                      threads=threads, phases=log)
    if runtime:
        with log.phase("runtime", RUNTIME_SECONDS) as ph:
            doc["runtime"] = measure_runtime(2)
            rt = doc["runtime"]
            ar = rt["collectives"]["all_reduce"]
            ph.figure = (f"2 gloo ranks: all-reduce {ar['bandwidth'] / 1e9:.2f} GB/s, "
                         f"{ar['latency'] * 1e3:.2f} ms; fixed cost per step of "
                         + ", ".join(f"{k} {_one_step(o) * 1e3:.1f} ms"
                                     for k, o in rt["overheads"].items()))
        doc["phases"] = log.records()
    return doc


def _one_step(o: dict[str, float]) -> float:
    """Seconds of a stored overhead fit for one layer and one micro-batch."""
    return o["per_step"] + o["per_layer_step"] + o["per_microbatch"] + o["per_layer"]


def runtime_document(world: int, raw: dict[str, Any]) -> dict[str, Any]:
    """The stored ``runtime`` section from the ranks' raw samples (fits included)."""
    collectives = {}
    for name in COLLECTIVES:
        alpha, bandwidth = fit_collective(name, world, [tuple(s) for s in raw["collectives"][name]])
        collectives[name] = {"latency": alpha, "bandwidth": bandwidth,
                             "samples": [list(s) for s in raw["collectives"][name]]}
    overheads = {}
    for style in STYLES:
        points = [tuple(p) for p in raw["overheads"][style]]
        o = solve_overhead(points)
        overheads[style] = {"per_step": o.per_step, "per_layer_step": o.per_layer_step,
                            "per_microbatch": o.per_microbatch, "per_layer": o.per_layer,
                            "points": [{"layers_per_rank": p[0], "microbatches": p[1],
                                        "seconds": p[2]} for p in points]}
    return {"world": world, "threads_per_rank": 1, "backend": "gloo",
            "collectives": collectives, "overheads": overheads,
            "method": ("collectives: best of 2-20 calls per size, 3 s in all, least-squares "
                       "ring fit on the relative error; overheads: shardlab train on a d=16, "
                       "8-token model, the fastest of steps 3-5 (each its slowest rank), 4 points "
                       "per style fitted to per_step + L*per_layer_step + m*(per_microbatch + "
                       "L*per_layer)")}


