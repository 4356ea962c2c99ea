"""``shardlab.calibrate.budget`` and the measurement's budgets: a dtype with no fast
kernel here costs its share of the budget, not minutes, on any CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shardlab.calibrate.budget import HARD_CAP, Phases, best_seconds, matmul_side

SLOW_BF16 = 1e9
"""FLOP/s the slowed-down bf16 matmul of these tests runs at (torch's generic bf16 GEMM
measured 1.6e9 on one thread of a CPU without native bf16)."""


def test_best_seconds_runs_while_the_budget_lasts() -> None:
    calls = []
    best, runs = best_seconds(lambda: calls.append(1), 0.02, min_runs=3)
    assert runs >= 3 and len(calls) == runs + 1  # one warm-up, not timed
    assert 0 <= best < 0.02


def test_best_seconds_stops_a_slow_run_at_the_hard_cap() -> None:
    # Each run takes 5x the budget: one warm-up and one timed run, never the 5 asked for.
    start = time.perf_counter()
    best, runs = best_seconds(lambda: time.sleep(0.05), 0.01, min_runs=5)
    assert runs == 1 and best >= 0.05
    assert time.perf_counter() - start < 0.05 * 2 + 0.1


def test_matmul_side_fits_the_runs_in_the_budget() -> None:
    # (0.72 s x 1.6e9 FLOP/s / (2 x 6))^(1/3) = 458 -> 448, a multiple of 64.
    assert matmul_side(1.6e9, 0.72, 5, 2048) == 448
    n = 448
    assert 6 * 2 * n**3 / 1.6e9 <= 0.72
    assert matmul_side(1e15, 1.0, 5, 2048) == 2048  # at most the largest side
    assert matmul_side(1.0, 1.0, 5, 2048) == 64  # at least the smallest
    assert matmul_side(float("nan"), 1.0, 5, 2048) == 64
    assert matmul_side(1e15, 1.0, 5, 32) == 32  # a largest side under the smallest


def test_phases_record_and_call_back() -> None:
    seen: list[tuple[str, str]] = []
    log = Phases(on_begin=lambda p: seen.append(("begin", p.name)),
                 on_end=lambda p: seen.append(("end", p.figure)))
    with log.phase("a", 0.5) as ph:
        ph.figure = "42 FLOP/s"
    assert seen == [("begin", "a"), ("end", "42 FLOP/s")]
    (rec,) = log.records()
    assert rec["name"] == "a" and rec["budget_s"] == 0.5 and rec["figure"] == "42 FLOP/s"
    assert rec["seconds"] >= 0


def slow_bf16_mm(a: Any, b: Any, out: Any) -> Any:
    """torch.mm, with bf16 slowed to :data:`SLOW_BF16` FLOP/s: a CPU without native bf16."""
    import torch

    if a.dtype == torch.bfloat16:
        time.sleep(2.0 * a.shape[0] * a.shape[1] * b.shape[1] / SLOW_BF16)
    return torch.mm(a, b, out=out)


def test_a_slow_dtype_is_sized_to_its_budget_and_marked_emulated() -> None:
    pytest.importorskip("torch")
    from shardlab.calibrate.cpu import BUDGET_SHARES, measure_cpu

    seconds = 2.0
    doc = measure_cpu(seconds, threads=1, copy_bytes=2**22, mm=slow_bf16_mm)
    assert doc["kernels"] == {"fp32": "native", "bf16": "emulated"}
    # Sized from the probe so that a warm-up and 5 runs fit bf16's share: not n = 2048,
    # whose 6 runs at 1 GFLOP/s would take 103 s.
    n = doc["peak_matmul_n"]["bf16"]
    assert n < 2048 and 6 * 2 * n**3 / SLOW_BF16 <= BUDGET_SHARES["bf16 peak"] * seconds
    assert doc["peak_flops"]["bf16"] <= SLOW_BF16
    phases = {p["name"]: p for p in doc["phases"]}
    assert list(phases) == list(BUDGET_SHARES)
    for name in ("probe", "bf16 peak"):
        assert phases[name]["seconds"] <= HARD_CAP * phases[name]["budget_s"] + 0.5, name


@pytest.mark.multiprocess
def test_torch_s_own_slow_bf16_path_is_found(tmp_path: Path) -> None:
    """oneDNN held to AVX2 and ATen to its AVX2 kernels: torch's generic bf16 GEMM, the path
    of a CPU without native bf16, on any x86 CPU (one process, about 5 s)."""
    pytest.importorskip("torch")
    code = ("import json, sys; from shardlab.calibrate.cpu import measure_cpu; "
            "json.dump(measure_cpu(1.0, threads=1, copy_bytes=2**22), sys.stdout)")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["kernels"]["bf16"] == "emulated" and not doc["torch_bf16_kernel"]
    assert doc["peak_flops"]["bf16"] < doc["peak_flops"]["fp32"] / 4
    bf16 = next(p for p in doc["phases"] if p["name"] == "bf16 peak")
    assert bf16["seconds"] <= HARD_CAP * bf16["budget_s"] + 0.5


def test_ctrl_c_keeps_the_stored_measurement(tmp_path: Path) -> None:
    """SIGINT in the middle of --measure: exit 130, one line, the stored file untouched."""
    pytest.importorskip("torch")
    home = tmp_path / "home"
    home.mkdir()
    before = '{"schema": "kept as it was"}\n'
    (home / "cpu.json").write_text(before)
    p = subprocess.Popen([sys.executable, "-m", "shardlab", "hardware", "--measure",
                          "--no-runtime", "--seconds", "30"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "SHARDLAB_HOME": str(home)},
                         # A suite started in the background of a shell inherits SIGINT
                         # ignored, and Python then installs no KeyboardInterrupt for it.
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = p.stderr.readline()  # the first phase has ended: measuring is under way
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert first.split()[0] == "probe", first
    assert p.returncode == 130, err
    assert out == "" and "Traceback" not in err
    assert err.splitlines()[-1] == (f"shardlab hardware: interrupted: nothing stored, "
                                    f"{home / 'cpu.json'} is as it was")
    assert (home / "cpu.json").read_text() == before
    assert [q.name for q in home.iterdir()] == ["cpu.json"]
