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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from shardlab.errors import SpecError
from shardlab.schedules.actions import Action, Schedule


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


class Event(NamedTuple):
    """One action placed in time on one rank."""

    rank: int
    start: float
    end: float
    action: Action


@dataclass(frozen=True)
class Timing:
    """The result of simulating a schedule."""

    schedule: Schedule
    events: tuple[tuple[Event, ...], ...]  # per rank, in order
    makespan: float
    bubble: float
    bubble_per_rank: tuple[float, ...]
    peak_inflight: tuple[int, ...]


_BIT = {"F": 1, "B": 2, "I": 4, "W": 8}
_WHOLE = (_BIT["F"] | _BIT["B"], _BIT["F"] | _BIT["I"] | _BIT["W"])


def _check_actions(s: Schedule) -> None:
    """Every (stage, micro-batch) has one F and one B or one I + one W, on its stage's rank.

    Each (stage, micro-batch) keeps a bit per kind it has seen: one pass over the actions
    and one over the bits, no set of actions (this check is a third of a large timing)."""
    n_mb = s.microbatches
    seen = [0] * (s.stages * n_mb)
    for rank, actions in enumerate(s.ranks):
        for a in actions:
            bit = _BIT.get(a.kind)
            if bit is None:
                raise SpecError("schedule", str(a), "has an unknown kind (F, B, I, W)")
            if not (0 <= a.stage < s.stages and 0 <= a.microbatch < n_mb):
                raise SpecError("schedule", str(a), f"is outside {s.stages} stages x "
                                f"{n_mb} micro-batches")
            if s.placement[a.stage] != rank:
                raise SpecError("schedule", str(a), f"runs on rank {rank}, but stage {a.stage} "
                                f"lives on rank {s.placement[a.stage]}")
            i = a.stage * n_mb + a.microbatch
            if seen[i] & bit:
                raise SpecError("schedule", str(a), f"runs twice (rank {rank})")
            seen[i] |= bit
    for i, has in enumerate(seen):
        if has not in _WHOLE:
            stage, mb = divmod(i, n_mb)
            problem = ("missing F" if not has & _BIT["F"] else "both B and I or W"
                       if has & _BIT["B"] else "missing B or I+W")
            raise SpecError("schedule", f"stage {stage} micro-batch {mb}",
                            f"needs exactly one F and one B or one I+W ({problem})")


def simulate(s: Schedule, d: Durations = Durations()) -> Timing:
    """Time every action of ``s`` (module docstring); SpecError if it is invalid or deadlocks."""
    _check_actions(s)
    if d.stage_scale and len(d.stage_scale) != s.stages:
        raise SpecError("stage_scale", ",".join(f"{x:g}" for x in d.stage_scale),
                        f"gives {len(d.stage_scale)} factors; must give one per stage "
                        f"({s.stages}: {s.pp} ranks x {s.virtual_stages} chunks)")
    n_st, n_mb, last = s.stages, s.microbatches, s.stages - 1
    placement = s.placement

    # Integer keys of what an action produces: its forward output (F), its input gradient
    # (G: from B or I, which a W also waits for) and its weight gradient (W).
    def key(code: int, stage: int, mb: int) -> int:
        return (code * n_st + stage) * n_mb + mb

    F, G, W = 0, 1, 2
    produces = {"F": F, "B": G, "I": G, "W": W}
    base = {"F": d.t_f, "B": d.t_b + d.t_w, "I": d.t_b, "W": d.t_w}
    scale = d.stage_scale
    end: dict[int, float] = {}
    pos = [0] * s.pp
    free = [0.0] * s.pp
    events: list[list[Event]] = [[] for _ in range(s.pp)]
    waiting: dict[int, list[int]] = {}
    ready = list(range(s.pp))
    while ready:
        r = ready.pop()
        actions = s.ranks[r]
        while pos[r] < len(actions):
            a = actions[pos[r]]
            kind, st, mb = a
            # (key, crosses ranks) of each input the action needs.
            if kind == "F":
                deps = ((key(F, st - 1, mb), placement[st - 1] != r),) if st else ()
            elif kind == "W":
                deps = ((key(G, st, mb), False),)
            elif st == last:
                deps = ((key(F, st, mb), False),)
            else:
                deps = ((key(F, st, mb), False), (key(G, st + 1, mb), placement[st + 1] != r))
            start = free[r]
            blocked = -1
            for k, remote in deps:
                t = end.get(k)
                if t is None:
                    blocked = k
                    break
                start = max(start, t + d.p2p if remote else t)
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(r)
                break
            finish = start + (base[kind] * scale[st] if scale else base[kind])
            events[r].append(Event(r, start, finish, a))
            free[r] = finish
            pos[r] += 1
            k = key(produces[kind], st, mb)
            end[k] = finish
            ready.extend(waiting.pop(k, ()))
    stuck = [r for r in range(s.pp) if pos[r] < len(s.ranks[r])]
    if stuck:
        r = stuck[0]
        raise SpecError("schedule", s.name, f"deadlocks: rank {r} waits forever at "
                        f"{s.ranks[r][pos[r]]} (action {pos[r]})")
    if not all(math.isfinite(ev[-1].end) for ev in events if ev):
        raise SpecError("durations", f"t_f={d.t_f:g} t_b={d.t_b:g} t_w={d.t_w:g} p2p={d.p2p:g}",
                        "add up past the largest float (the timeline would be inf); use a "
                        "larger unit")
    return _measure(s, events)


def _measure(s: Schedule, events: list[list[Event]]) -> Timing:
    makespan = max((ev[-1].end for ev in events if ev), default=0.0)
    busy = [sum(e.end - e.start for e in ev) for ev in events]
    total = makespan * s.pp
    bubble = (total - sum(busy)) / total if total else 0.0
    per_rank = []
    for ev, b in zip(events, busy, strict=True):
        span = ev[-1].end - ev[0].start if ev else 0.0
        per_rank.append((span - b) / span if span else 0.0)
    peaks = []
    for ev in events:
        held = peak = 0
        for e in ev:
            if e.action.kind == "F":
                held += 1
                peak = max(peak, held)
            elif e.action.kind in ("B", "W"):  # the last backward piece frees them
                held -= 1
        peaks.append(peak)
    return Timing(s, tuple(tuple(ev) for ev in events), makespan, bubble, tuple(per_rank),
                  tuple(peaks))
