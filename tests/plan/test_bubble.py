"""Bubble ratios: closed forms equal to the simulator, zero-bubble idle constant past 2p."""

import numpy as np
import pytest

from shardlab.config.layout import SCHEDULES
from shardlab.plan import bubble
from shardlab.plan.bubble import (
    SIMULATED_MAX_PP,
    bubble_ratio,
    bubble_ratios,
    idle_units_formula,
    simulated_idle_units,
)
from shardlab.schedules.generators import build
from shardlab.schedules.simulate import simulate


@pytest.mark.parametrize(("kind", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2),
                                         ("interleaved-1f1b", 3)])
def test_closed_forms_equal_the_simulator(kind: str, v: int) -> None:
    for p in (2, 4, 8):
        for m in (p, 2 * p, 5 * p):
            busy = 3 * m * v
            sim = (simulate(build(kind, p, m, v)).makespan - busy) / busy
            assert bubble_ratio(kind, p, m, v) == pytest.approx(sim)


@pytest.mark.parametrize("kind", ["zb-h1", "zb-h2", "zb-v", "dualpipev"])
def test_idle_time_stops_growing_at_two_p_micro_batches(kind: str) -> None:
    v = 2 if kind in ("zb-v", "dualpipev") else 1
    for p in (2, 4, 6, 8):
        base = simulated_idle_units(kind, p, 2 * p, v)
        for m in (2 * p + 1, 3 * p, 5 * p):
            assert simulated_idle_units(kind, p, m, v) == pytest.approx(base)
        # So the ratio at large m is the 2p idle time over the larger busy time.
        assert bubble_ratio(kind, p, 7 * p, v) == pytest.approx(base / (3 * 7 * p * v))


def test_vectorised_ratios_equal_the_scalar_ones() -> None:
    rows = [(s, p, m, v) for s in SCHEDULES for p in (1, 2, 4) for m in (4, 8, 12)
            for v in ((2,) if s in ("interleaved-1f1b", "zb-v", "dualpipev") else (1,))
            if not (s == "interleaved-1f1b" and m % p) and not (s == "dualpipev" and m < 2 * p)]
    a = np.array([(SCHEDULES.index(s), p, m, v) for s, p, m, v in rows])
    got = bubble_ratios(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    want = [bubble_ratio(s, p, m, v) for s, p, m, v in rows]
    assert got.tolist() == pytest.approx(want)
    assert (got[a[:, 1] == 1] == 0).all()
    # More micro-batches, smaller bubble; interleaving shrinks it.
    assert bubble_ratio("1f1b", 4, 16, 1) < bubble_ratio("1f1b", 4, 8, 1)
    assert bubble_ratio("interleaved-1f1b", 4, 8, 2) < bubble_ratio("1f1b", 4, 8, 1)
    assert bubble_ratio("zb-h2", 4, 8, 1) < bubble_ratio("1f1b", 4, 8, 1)


@pytest.mark.parametrize("kind", ["zb-h1", "zb-h2", "zb-v", "dualpipev"])
def test_idle_formula_equals_the_simulator(kind: str) -> None:
    v = 2 if kind in ("zb-v", "dualpipev") else 1
    for p in (2, 3, 5, 8, 13, 17, 24):
        # Every m up to 2p for small p, the edges and the middle beyond.
        ms = range(1, 2 * p + 1) if p <= 8 else (1, p - 1, p, p + 1, 2 * p - 1, 2 * p)
        for m in ms:
            if kind == "dualpipev" and m < 2 * p:
                continue  # needs 2p micro-batches (the planner rejects fewer)
            assert idle_units_formula(kind, p, m) == simulated_idle_units(kind, p, m, v), (p, m)


def test_deep_pipelines_are_not_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    # Simulating p = 1024 takes minutes: a 4,096-layer plan once printed nothing for that long.
    def refuse(kind: str, p: int, m: int, v: int) -> float:
        raise AssertionError(f"simulated p={p}")

    monkeypatch.setattr(bubble, "simulated_idle_units", refuse)
    p = SIMULATED_MAX_PP + 1
    for kind, v in (("zb-h1", 1), ("zb-h2", 1), ("zb-v", 2), ("dualpipev", 2)):
        for deep in (p, 1024):
            want = idle_units_formula(kind, deep, 2 * deep) / (3 * 8 * deep * v)
            assert bubble_ratio(kind, deep, 8 * deep, v) == pytest.approx(want)
