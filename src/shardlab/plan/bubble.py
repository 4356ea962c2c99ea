"""The pipeline bubble of a schedule, from :mod:`shardlab.schedules`, as a ratio to the work.

For a rank that does m·v forward and backward chunk passes, the bubble ratio is the idle
time of the busiest rank inside the step's makespan over its busy time, at equal
forward, input-gradient and weight-gradient times (t_f = t_b = t_w, one unit each):

    ratio = (makespan - 3·m·v) / (3·m·v)

GPipe, 1F1B and interleaved 1F1B use the papers' closed forms
(:mod:`shardlab.schedules.closed_forms`, which ``tests/schedules`` holds equal to the
simulator): the makespan is 3·(m·v + p - 1) units for GPipe/1F1B with v = 1, and the
bubble fraction (p-1)/(v·m + p - 1) for interleaving, i.e. ratio (p-1)/(v·m). The
zero-bubble and V schedules (ZB-H1, ZB-H2, ZB-V, DualPipeV) are generated and timed by
:func:`shardlab.schedules.simulate.simulate` up to p = :data:`SIMULATED_MAX_PP`. Their
idle time stops growing once m >= 2p (steady state; ``tests/plan/test_bubble.py`` checks
it), so larger m is simulated at 2p and the idle time reused: a search touches each
(schedule, p, m) at most once and never builds schedules longer than 2p micro-batches.
Deeper pipelines take the idle units the simulator gives on every p, m it is run on
(:func:`idle_units_formula`; the tests hold the two equal), since simulating a schedule
costs about p·m·p steps (seconds at p = 48, minutes past a few hundred):

    ZB-H1, ZB-H2: max(2p - 1 - m, p - 1)    ZB-V: max(4p - 2 - 2m, p - 1)
    DualPipeV (m >= 2p): p - 1

Unequal t_f, t_b, t_w (recompute lengthens the backward) change GPipe's and 1F1B's
bubble not at all ((p-1)·(t_f + t_b + t_w)) and the zero-bubble ones somewhat; the
planner uses the equal-times ratio for all.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from shardlab.config.layout import SCHEDULES
from shardlab.plan.space import unique_rows
from shardlab.schedules.closed_forms import bubble_1f1b, bubble_interleaved
from shardlab.schedules.generators import build
from shardlab.schedules.simulate import simulate

_CLOSED = ("gpipe", "1f1b", "interleaved-1f1b")


SIMULATED_MAX_PP = 16
"""Deepest pipeline whose zero-bubble schedules are simulated (a few ms each); deeper ones
take :func:`idle_units_formula`."""


def idle_units_formula(kind: str, p: int, m: int) -> float:
    """Idle units of a rank (makespan - 3·m·v) of a zero-bubble or V schedule at equal
    forward, input-gradient and weight-gradient times: what the simulator gives
    (module docstring; DualPipeV needs m >= 2p)."""
    if kind in ("zb-h1", "zb-h2"):
        return float(max(2 * p - 1 - m, p - 1))
    if kind == "zb-v":
        return float(max(4 * p - 2 - 2 * m, p - 1))
    if kind == "dualpipev":
        return float(p - 1)
    raise ValueError(f"no idle-units formula for {kind}")


@lru_cache(maxsize=4096)
def simulated_idle_units(kind: str, p: int, m: int, v: int) -> float:
    """Idle units of a rank inside the makespan (makespan - 3·m·v) of the simulated schedule."""
    timing = simulate(build(kind, p, m, v))
    return float(timing.makespan - 3 * m * v)


def bubble_ratio(kind: str, p: int, m: int, v: int) -> float:
    """Idle time over busy time of a rank for schedule ``kind`` (module docstring)."""
    if p == 1:
        return 0.0
    if kind in ("gpipe", "1f1b"):
        f = bubble_1f1b(p, m)
        return f / (1 - f)
    if kind == "interleaved-1f1b":
        f = bubble_interleaved(p, m, v)
        return f / (1 - f)
    if p > SIMULATED_MAX_PP:
        idle = idle_units_formula(kind, p, min(m, 2 * p))
    else:
        idle = simulated_idle_units(kind, p, min(m, 2 * p), v)
    return idle / (3 * m * v)


def bubble_ratios(schedule: np.ndarray, pp: np.ndarray, microbatches: np.ndarray,
                  virtual: np.ndarray) -> np.ndarray:
    """:func:`bubble_ratio` for arrays of layouts (schedule as an index into SCHEDULES)."""
    out = np.zeros(len(pp))
    closed = np.isin(schedule, [SCHEDULES.index(k) for k in _CLOSED])
    p, m, v = pp.astype(float), microbatches.astype(float), virtual.astype(float)
    # Closed forms, vectorised: ratio = (p-1)/(v·m) (GPipe and 1F1B have v = 1).
    out[closed] = (p[closed] - 1) / (v[closed] * m[closed])
    rest = np.flatnonzero(~closed & (pp > 1))
    if len(rest):
        uniq, inv = unique_rows(schedule[rest], pp[rest], microbatches[rest], virtual[rest])
        vals = np.array([bubble_ratio(SCHEDULES[int(s)], int(pi), int(mi), int(vi))
                         for s, pi, mi, vi in uniq])
        out[rest] = vals[inv.ravel()]
    return out
