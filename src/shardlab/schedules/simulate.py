"""Place every action of a schedule in time, validate it, and measure bubble and memory.

Each rank runs its actions in order; an action starts at the earliest time its rank
is free and its inputs are there: a forward needs the previous stage's forward of
the same micro-batch, a backward (B or I) needs its own forward and the next
stage's backward of that micro-batch (the last stage starts backward from the
loss), a W needs its own I. A dependency on another rank adds the point-to-point
latency. This is list scheduling in program order, so the times are unique and
the cost is linear in the number of actions.

Bubble: overall, the idle fraction of ranks x makespan; per rank, the idle fraction
of the span between that rank's own first start and last end (so a schedule whose
ranks start and end staggered, like ZB-H2's parallelogram, can be bubble-free per
rank). Memory: a rank holds a (stage, micro-batch)'s activations from its forward
until the end of its last backward piece (B, or W when split).

How it runs: the checks, each action's inputs and durations and the measures are numpy
over the flat action arrays (:attr:`Schedule.columns`); only the placement in time is a
Python loop, over plain lists of numbers. That loop is inherently sequential (a start
waits for earlier ends), but it no longer builds an object or hashes a key per action.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise, repeat
from typing import NamedTuple

import numpy as np

from shardlab.errors import SpecError
from shardlab.schedules.actions import Action, Columns, Schedule

_F, _B, _I, _W = range(4)  # KINDS_OF_ACTION's codes in Schedule.columns


@dataclass(frozen=True)
class Durations:
    """Seconds (or any unit) of each action kind; full backward B takes t_b + t_w.

    ``stage_scale`` multiplies every action of a stage (per-stage imbalance, e.g. the
    embedding or head stage being slower); ``p2p`` is added to each dependency that
    crosses ranks.
    """

    t_f: float = 1.0
    t_b: float = 1.0
    t_w: float = 1.0
    p2p: float = 0.0
    stage_scale: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("t_f", "t_b", "t_w", "p2p"):
            v = getattr(self, name)
            if not (v >= 0 and v != float("inf")):
                raise SpecError(name.replace("_", "-"), v, "must be a finite number >= 0")
        for s in self.stage_scale:
            if not (s > 0 and s != float("inf")):
                raise SpecError("stage_scale", s, "every factor must be a finite number > 0")


def stage_layer_scale(stage_layers: tuple[int, ...] | list[int],
                      scale: tuple[float, ...] = ()) -> tuple[float, ...]:
    """:attr:`Durations.stage_scale` of model chunks holding ``stage_layers`` layers each:
    the counts themselves, so t_f, t_b and t_w are the times of one layer (uneven stages
    take their layers' time), times ``scale``'s factor of each chunk where given."""
    if scale and len(scale) != len(stage_layers):
        raise SpecError("stage_scale", ",".join(f"{x:g}" for x in scale),
                        f"gives {len(scale)} factors for {len(stage_layers)} stage layer counts")
    return tuple(float(n) * (scale[i] if scale else 1.0) for i, n in enumerate(stage_layers))


class Event(NamedTuple):
    """One action placed in time on one rank."""

    rank: int
    start: float
    end: float
    action: Action


@dataclass(frozen=True)
class Timing:
    """The result of simulating a schedule.

    ``start`` and ``end`` hold every action's times in the order of
    :attr:`Schedule.columns` (rank 0's actions first, each rank's in its own order);
    :attr:`events` gives the same as objects, built only when asked for.
    """

    schedule: Schedule
    start: np.ndarray = field(repr=False, compare=False)  # float64, read-only
    end: np.ndarray = field(repr=False, compare=False)
    makespan: float
    bubble: float
    bubble_per_rank: tuple[float, ...]
    peak_inflight: tuple[int, ...]

    @cached_property
    def events(self) -> tuple[tuple[Event, ...], ...]:
        """Per rank, its actions in order with their times."""
        start, end = self.start.tolist(), self.end.tolist()
        bounds = self.schedule.columns.offsets.tolist()
        return tuple(tuple(map(Event, repeat(r), start[a:b], end[a:b], actions))
                     for r, ((a, b), actions) in enumerate(zip(pairwise(bounds),
                                                               self.schedule.ranks, strict=True)))


def _action(s: Schedule, c: Columns, i: int) -> Action:
    """The action at flat position ``i`` of :attr:`Schedule.columns`."""
    r = int(c.rank[i])
    return s.ranks[r][i - int(c.offsets[r])]


def _check_actions(s: Schedule, c: Columns) -> None:
    """Every (stage, micro-batch) has one F and one B or one I + one W, on its stage's rank.

    The error names the first action in rank order that breaks a rule, checked in this
    order: a known kind, a stage and micro-batch in range, the stage's rank, not twice."""
    n_st, n_mb = s.stages, s.microbatches
    unknown = c.kind < 0
    outside = ~unknown & ~((c.stage >= 0) & (c.stage < n_st)
                           & (c.microbatch >= 0) & (c.microbatch < n_mb))
    fine = ~unknown & ~outside
    place = np.asarray(s.placement, dtype=np.int64)
    elsewhere = fine & (place[np.where(fine, c.stage, 0)] != c.rank)
    # A repeat: a (stage, micro-batch, kind) seen earlier in rank order. A stable sort puts
    # equal keys in that order, so all but the first of each run are repeats.
    pair = c.stage * n_mb + c.microbatch
    key = np.where(fine, pair * 4 + c.kind, -1 - np.arange(len(c.kind)))
    order = np.argsort(key, kind="stable")
    twice = np.zeros(len(key), dtype=bool)
    twice[order[1:]] = key[order[1:]] == key[order[:-1]]
    bad = unknown | outside | elsewhere | twice
    if bad.any():
        i = int(np.argmax(bad))
        a, rank = _action(s, c, i), int(c.rank[i])
        if unknown[i]:
            raise SpecError("schedule", str(a), "has an unknown kind (F, B, I, W)")
        if outside[i]:
            raise SpecError("schedule", str(a), f"is outside {n_st} stages x {n_mb} micro-batches")
        if elsewhere[i]:
            raise SpecError("schedule", str(a), f"runs on rank {rank}, but stage {a.stage} "
                            f"lives on rank {s.placement[a.stage]}")
        raise SpecError("schedule", str(a), f"runs twice (rank {rank})")
    # No repeats, so the sum of the kinds' bits per pair is their union: F|B or F|I|W.
    has = np.bincount(pair, weights=np.array([1, 2, 4, 8])[c.kind], minlength=n_st * n_mb)
    wrong = ~np.isin(has, (3, 13))
    if wrong.any():
        stage, mb = divmod(int(np.argmax(wrong)), n_mb)
        bits = int(has[stage * n_mb + mb])
        problem = ("missing F" if not bits & 1 else "both B and I or W" if bits & 2
                   else "missing B or I+W")
        raise SpecError("schedule", f"stage {stage} micro-batch {mb}",
                        f"needs exactly one F and one B or one I+W ({problem})")


def _inputs(s: Schedule, c: Columns, p2p: float) -> tuple[np.ndarray, ...]:
    """For every action, the flat positions of the (at most two) actions whose outputs it
    needs (-1: none) and the latency each adds (``p2p`` when it crosses ranks)."""
    n_mb, last = s.microbatches, s.stages - 1
    pair = c.stage * n_mb + c.microbatch
    is_f, is_w = c.kind == _F, c.kind == _W
    is_g = (c.kind == _B) | (c.kind == _I)  # each makes the input gradient
    forward = np.full(s.stages * n_mb, -1, dtype=np.int64)  # pair -> position of its F
    gradient = np.full(s.stages * n_mb, -1, dtype=np.int64)  # pair -> its B or I
    forward[pair[is_f]] = np.flatnonzero(is_f)
    gradient[pair[is_g]] = np.flatnonzero(is_g)
    first = np.full(len(pair), -1, dtype=np.int64)
    up = is_f & (c.stage > 0)
    first[up] = forward[pair[up] - n_mb]  # the previous stage's forward
    first[is_g] = forward[pair[is_g]]  # its own forward
    first[is_w] = gradient[pair[is_w]]  # its own I
    second = np.full(len(pair), -1, dtype=np.int64)
    down = is_g & (c.stage < last)
    second[down] = gradient[pair[down] + n_mb]  # the next stage's input gradient

    def latency(dep: np.ndarray) -> np.ndarray:
        return np.where((dep >= 0) & (c.rank[dep] != c.rank), p2p, 0.0)

    return first, latency(first), second, latency(second)


def simulate(s: Schedule, d: Durations = Durations()) -> Timing:
    """Time every action of ``s`` (module docstring); SpecError if it is invalid or deadlocks."""
    c = s.columns
    _check_actions(s, c)
    if d.stage_scale and len(d.stage_scale) != s.stages:
        raise SpecError("stage_scale", ",".join(f"{x:g}" for x in d.stage_scale),
                        f"gives {len(d.stage_scale)} factors; must give one per stage "
                        f"({s.stages}: {s.pp} ranks x {s.virtual_stages} chunks)")
    base = np.array([d.t_f, d.t_b + d.t_w, d.t_b, d.t_w], dtype=np.float64)[c.kind]
    dur = base * np.array(d.stage_scale, dtype=np.float64)[c.stage] if d.stage_scale else base
    first, lat1, second, lat2 = _inputs(s, c, d.p2p)
    start, end, pos = _place(c.offsets.tolist(), first.tolist(), lat1.tolist(),
                             second.tolist(), lat2.tolist(), dur.tolist())
    bounds = c.offsets.tolist()
    stuck = [r for r in range(len(pos)) if pos[r] < bounds[r + 1]]
    if stuck:
        r = stuck[0]
        i = pos[r] - bounds[r]
        raise SpecError("schedule", s.name, f"deadlocks: rank {r} waits forever at "
                        f"{s.ranks[r][i]} (action {i})")
    start_a, end_a = np.array(start, dtype=np.float64), np.array(end, dtype=np.float64)
    if not np.isfinite(end_a).all():
        raise SpecError("durations", f"t_f={d.t_f:g} t_b={d.t_b:g} t_w={d.t_w:g} p2p={d.p2p:g}",
                        "add up past the largest float (the timeline would be inf); use a "
                        "larger unit")
    start_a.flags.writeable = end_a.flags.writeable = False  # a Timing is frozen
    return _measure(s, c, start_a, end_a)


def _place(bounds: list[int], first: list[int], lat1: list[float], second: list[int],
           lat2: list[float], dur: list[float]) -> tuple[list[float], list[float], list[int]]:
    """List scheduling: run each rank's actions in order while their inputs are there; a
    rank that waits is woken by the action it waits for. Returns start and end per action
    and, per rank, the position it reached (short of its end only in a deadlock)."""
    n, ranks = len(dur), len(bounds) - 1
    start, end = [0.0] * n, [-1.0] * n  # an end < 0: not run yet (times are >= 0)
    pos, free = bounds[:-1], [0.0] * ranks
    waiting: dict[int, list[int]] = {}  # position -> ranks waiting for its output
    ready = list(range(ranks))
    while ready:
        r = ready.pop()
        i, stop, t = pos[r], bounds[r + 1], free[r]
        while i < stop:
            begin = t
            k = first[i]
            if k >= 0:
                e = end[k]
                if e < 0.0:
                    waiting.setdefault(k, []).append(r)
                    break
                e += lat1[i]
                if e > begin:
                    begin = e
            k = second[i]
            if k >= 0:
                e = end[k]
                if e < 0.0:
                    waiting.setdefault(k, []).append(r)
                    break
                e += lat2[i]
                if e > begin:
                    begin = e
            start[i] = begin
            t = end[i] = begin + dur[i]
            woken = waiting.pop(i, None)
            if woken:
                ready.extend(woken)
            i += 1
        pos[r], free[r] = i, t
    return start, end, pos


def _measure(s: Schedule, c: Columns, start: np.ndarray, end: np.ndarray) -> Timing:
    bounds = c.offsets.tolist()
    makespan = float(end.max()) if len(end) else 0.0  # each rank's ends only grow
    # Python's sum, left to right, rather than numpy's pairwise one: the same figures to the
    # last bit as summing the events one by one.
    took = (end - start).tolist()
    busy = [sum(took[a:b]) for a, b in pairwise(bounds)]
    total = makespan * s.pp
    bubble = (total - sum(busy)) / total if total else 0.0
    per_rank = []
    for (a, b), work in zip(pairwise(bounds), busy, strict=True):
        span = float(end[b - 1] - start[a]) if b > a else 0.0
        per_rank.append((span - work) / span if span else 0.0)
    # Activations held: +1 at a forward, -1 at the last backward piece (B, or W when split).
    held = np.cumsum(np.select([c.kind == _F, (c.kind == _B) | (c.kind == _W)], [1, -1], 0))
    peaks = []
    for a, b in pairwise(bounds):
        before = int(held[a - 1]) if a else 0
        peaks.append(max(0, int(held[a:b].max()) - before) if b > a else 0)
    return Timing(s, start, end, makespan, bubble, tuple(per_rank), tuple(peaks))
