"""The simulated run's memory as the guard sees it, its progress reports, and the ring's
ragged chunks under dp that does not divide the gradient."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from shardlab.config.model import ModelShape
from shardlab.estimate.memory import stage_memory
from shardlab.nn.data import Batch, batches
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.model import TransformerLM
from shardlab.sim.engine import Parallel
from shardlab.sim.footprint import (
    RUNTIME_BYTES,
    device_peak_bytes,
    reference_peak_bytes,
    run_peak_bytes,
)
from shardlab.sim.run import layout_for, simulate_run

V = garden_vocab().size
LLAMA = ModelShape("llama", 4, 32, 4, V, 32, kv_heads=2, d_ff=64, style="llama", tied=False)


def _stream(size: int) -> Iterator[Batch]:
    return batches(garden_documents(300, 1), size, 32, seed=1)


def test_one_device_is_the_cost_model_and_every_device_counts() -> None:
    one = layout_for(LLAMA, Parallel(), 8, 32, torch.float32)
    assert device_peak_bytes(LLAMA, one) == [stage_memory(LLAMA, one, dropout=False)[0].total]
    four = layout_for(LLAMA, Parallel(dp=4), 8, 32, torch.float32)
    assert run_peak_bytes(LLAMA, four) == (RUNTIME_BYTES + reference_peak_bytes(LLAMA, four)
                                           + 4 * device_peak_bytes(LLAMA, four)[0])


def test_the_peak_covers_what_each_device_holds() -> None:
    par = Parallel(dp=2, tp=2, pp=2, zero=3, microbatches=2)
    lay = layout_for(LLAMA, par, 8, 32, torch.float64)
    r = simulate_run(LLAMA, par, [next(_stream(8))], torch.float64)
    peak = device_peak_bytes(LLAMA, lay)
    for s in r.state_bytes:
        stage = (s["rank"] // par.tp) % par.pp
        assert sum(s["counted"].values()) < peak[stage]


def test_progress_hears_each_phase_and_step_while_batches_are_read_lazily() -> None:
    drawn: list[int] = []

    def lazy() -> Iterator[Batch]:
        for i, b in enumerate(_stream(4)):
            drawn.append(i)
            yield b
            if i == 1:
                return

    heard: list[tuple[int, str, int]] = []
    r = simulate_run(LLAMA, Parallel(dp=2), lazy(), torch.float64,
                     progress=lambda done, line: heard.append((done, line, len(drawn))))
    assert len(r.losses) == 2
    assert [h[0] for h in heard] == [0, 0, 1, 2]
    assert "parameters" in heard[0][1] and "2 virtual devices" in heard[1][1]
    assert all("loss" in h[1] for h in heard[2:])
    assert [h[2] for h in heard[2:]] == [1, 2]  # step i reported with i batches read


def test_dp_not_dividing_the_gradient_passes_comm_dp() -> None:
    shape = ModelShape("two", 2, 32, 4, V, 32, kv_heads=2, d_ff=64, style="llama", tied=False)
    # 3 does not divide its parameter count: the ring all-reduce's chunks are ragged.
    assert sum(p.numel() for p in TransformerLM(shape).parameters()) % 3
    r = simulate_run(shape, Parallel(dp=3), [next(_stream(6))], torch.float64)
    assert r.passed, [(c.name, c.value, c.tolerance) for c in r.checks if not c.passed]
