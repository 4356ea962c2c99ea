"""``shardlab.calibrate.runtime``: the fits and configurations of the 2-rank measurement
(the measurement itself runs once, in tests/calibrate/test_cpu.py's CLI test)."""

from __future__ import annotations

import math

import pytest

from shardlab.calibrate.runtime import (
    fit_collective,
    measure_runtime,
    overhead_points,
    ring_terms,
    runtime_document,
    solve_overhead,
)
from shardlab.config.model import ModelShape
from shardlab.config.runtime import COLLECTIVES, STYLES, Overhead, parse_runtime
from shardlab.errors import SpecError
from shardlab.train.config import TrainConfig, check_config


@pytest.mark.parametrize("name", COLLECTIVES)
@pytest.mark.parametrize("p", [2, 4])
def test_fit_recovers_latency_and_bandwidth(name: str, p: int) -> None:
    alpha, bandwidth = 150e-6, 1.2e9
    samples = []
    for n in (2**14, 2**18, 2**22):
        ca, x = ring_terms(name, n, p)
        samples.append((float(n), ca * alpha + x / bandwidth))
    got = fit_collective(name, p, samples)
    assert got == pytest.approx((alpha, bandwidth), rel=1e-9)


def test_ring_terms_are_the_ring_formulas() -> None:
    n, p = 1e6, 4
    assert ring_terms("all_reduce", n, p) == (6.0, 2 * 3 / 4 * n)
    assert ring_terms("all_gather", n, p) == ring_terms("reduce_scatter", n, p) == (3.0, 0.75 * n)
    assert ring_terms("send", n, p) == (1.0, n)
    with pytest.raises(SpecError, match="collective"):
        ring_terms("broadcast", n, p)


def test_fit_never_gives_a_negative_latency() -> None:
    # Pure bandwidth (1 GB/s), the smallest size measured 5% faster than the line: the
    # unconstrained fit's α would come out < 0.
    samples = [(2**14, 0.95 * 2**14 / 1e9), (2**20, 2**20 / 1e9), (2**22, 2**22 / 1e9)]
    alpha, bandwidth = fit_collective("send", 2, samples)
    assert alpha == 0 and bandwidth == pytest.approx(1e9, rel=0.05)
    with pytest.raises(SpecError, match="at least 2"):
        fit_collective("send", 2, samples[:1])


def test_overhead_fit_recovers_its_four_terms() -> None:
    truth = Overhead(0.010, 0.002, 0.004, 0.020)
    points = [(L, m, truth.seconds(m, L)) for L in (1, 2) for m in (1, 2)]
    got = solve_overhead(points)
    for a, b in zip((got.per_step, got.per_layer_step, got.per_microbatch, got.per_layer),
                    (0.010, 0.002, 0.004, 0.020), strict=True):
        assert a == pytest.approx(b, abs=1e-12)


def test_overhead_fit_keeps_every_term_non_negative() -> None:
    # Noise that an exact solve would turn into a negative per-step term.
    points = [(1, 1, 0.030), (2, 1, 0.070), (1, 2, 0.060), (2, 2, 0.139)]
    got = solve_overhead(points)
    assert min(got.per_step, got.per_layer_step, got.per_microbatch, got.per_layer) >= 0
    for L, m, s in points:
        assert got.seconds(m, L) == pytest.approx(s, rel=0.15)


@pytest.mark.parametrize("style", STYLES)
def test_overhead_runs_are_valid_train_configs(style: str) -> None:
    seen = set()
    for layers_per_rank, m, fields in overhead_points(style, 2):
        fields = dict(fields)
        layers = fields.pop("layers")
        shape = ModelShape("tiny", layers, 16, 4, 64, 8, style="llama", tied=False)
        cfg = TrainConfig(shape=shape, seq=8, steps=6, docs=[[1] * 9] * 64, **fields)
        check_config(cfg)  # raises on anything shardlab train would refuse
        assert cfg.microbatches == m
        assert layers == layers_per_rank * cfg.pp and cfg.world == 2
        seen.add((layers_per_rank, m))
    assert len(seen) == 4  # four distinct points: the four terms are determined
    with pytest.raises(SpecError, match="style"):
        overhead_points("zero-bubble", 2)


def fake_raw() -> dict:
    coll = {name: [(float(n), 1e-4 + n / 1e9) for n in (2**14, 2**20, 2**22)]
            for name in COLLECTIVES}
    over = {s: [(L, m, 0.01 * (i + 1) * (1 + L * m)) for L in (1, 2) for m in (1, 2)]
            for i, s in enumerate(STYLES)}
    return {"collectives": coll, "overheads": over}


def test_document_round_trips_into_a_runtime() -> None:
    doc = runtime_document(2, fake_raw())
    rt = parse_runtime(doc)
    assert rt is not None and rt.world == 2
    assert set(rt.collectives) == set(COLLECTIVES) and set(rt.overheads) == set(STYLES)
    for name in COLLECTIVES:
        assert rt.collectives[name] == (doc["collectives"][name]["latency"],
                                        doc["collectives"][name]["bandwidth"])
    o = rt.overheads["tp"]
    assert o.seconds(2, 2) == pytest.approx(0.03 * 5, rel=1e-9)


@pytest.mark.parametrize("bad", [None, {}, {"world": 2}, "x",
                                 {"world": 1, "collectives": {}, "overheads": {}}])
def test_unusable_sections_are_ignored(bad: object) -> None:
    assert parse_runtime(bad) is None


def test_negative_or_infinite_figures_are_ignored() -> None:
    doc = runtime_document(2, fake_raw())
    doc["overheads"]["ddp"]["per_step"] = -1.0
    assert parse_runtime(doc) is None
    doc = runtime_document(2, fake_raw())
    doc["collectives"]["send"]["bandwidth"] = math.inf
    assert parse_runtime(doc) is None


def test_one_rank_is_refused_before_any_process_starts() -> None:
    with pytest.raises(SpecError, match="world"):
        measure_runtime(1)
