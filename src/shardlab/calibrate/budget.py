"""Time budgets for measuring this machine: phases with their own budgets, and timing loops
sized so that no phase runs a fixed count of large operations.

A CPU can run one dtype's matmul many times slower than another's: on a processor without
native bf16 (no AVX-512 BF16, no AMX) torch's bf16 ``mm`` is a scalar fallback near
1.6 GFLOP/s, where fp32 reaches 80-160 (measured on one thread, oneDNN held to AVX2 with
``ONEDNN_MAX_CPU_ISA=AVX2``). A measurement that times a fixed 2048-square matmul five
times then takes minutes instead of a second. So every large operation here is sized from
a small probe first (:func:`matmul_side`), and every loop stops at its deadline
(:func:`best_seconds`). Nothing here imports torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

HARD_CAP = 3.0
"""A timing loop stops after this many times its budget even short of its fewest runs
(always after one timed run): a run slower than the probe said cannot run away."""


def best_seconds(fn: Callable[[], object], budget: float, min_runs: int = 1) -> tuple[float, int]:
    """(shortest wall time in seconds of ``fn()``, timed runs) within about ``budget`` s.

    One untimed warm-up run first (allocation, page faults, kernel choice), counted in the
    budget; then timed runs while the budget lasts, at least ``min_runs`` of them unless
    that would pass :data:`HARD_CAP` x ``budget``, and always at least one. The best run
    counts: other jobs on a shared machine only slow a run down, never speed it up.
    """
    start = time.perf_counter()
    fn()
    best, runs = math.inf, 0
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        best, runs = min(best, t1 - t0), runs + 1
        spent = t1 - start
        if spent >= HARD_CAP * budget or (runs >= min_runs and spent >= budget):
            return best, runs


def matmul_side(flops_per_s: float, budget: float, runs: int, largest: int,
                smallest: int = 64, step: int = 64) -> int:
    """The largest square side n (a multiple of ``step``, at most ``largest``, at least
    ``smallest``) whose ``runs`` + 1 matmuls (one warm-up) of 2·n³ FLOPs each fit in
    ``budget`` seconds at ``flops_per_s``: n = (budget·rate / (2·(runs + 1)))^(1/3)."""
    if flops_per_s <= 0 or not math.isfinite(flops_per_s):
        return min(smallest, largest)
    n = (budget * flops_per_s / (2.0 * (runs + 1))) ** (1 / 3)
    n = int(n // step * step)
    return max(min(smallest, largest), min(largest, n))


@dataclass
class Phase:
    """One phase of a measurement: its name, budget (s), the seconds it took and a line
    saying what it found."""

    name: str
    budget: float
    seconds: float = 0.0
    figure: str = ""


@dataclass
class Phases:
    """The phases of one measurement, each with its own budget, timed as they run.

    ``on_begin(phase)`` and ``on_end(phase)``, when given, are called around each phase
    (a progress display); :meth:`records` is the JSON-ready list stored with the
    measurement.
    """

    on_begin: Callable[[Phase], None] | None = None
    on_end: Callable[[Phase], None] | None = None
    done: list[Phase] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str, budget: float) -> Iterator[Phase]:
        """Run one phase: yields its :class:`Phase`, whose ``figure`` the body sets."""
        current = Phase(name, budget)
        if self.on_begin is not None:
            self.on_begin(current)
        start = time.perf_counter()
        yield current
        current.seconds = time.perf_counter() - start
        self.done.append(current)
        if self.on_end is not None:
            self.on_end(current)

    def records(self) -> list[dict[str, Any]]:
        """Each finished phase as {"name", "budget_s", "seconds", "figure"}."""
        return [{"name": p.name, "budget_s": p.budget, "seconds": p.seconds, "figure": p.figure}
                for p in self.done]
