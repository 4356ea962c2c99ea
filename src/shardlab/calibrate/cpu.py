"""This machine's CPU, measured with torch and stored, so it can stand in for an accelerator.

``shardlab hardware --measure`` times these and writes one JSON file. Each is a phase
with its own share of the time budget (:data:`BUDGET_SHARES`), and no phase runs a fixed
count of large operations (:mod:`shardlab.calibrate.budget`), so the whole takes about
its budget on any CPU:

* **peak FLOP/s per dtype** (``fp32``, ``bf16``): first a probe, one 256-square matmul
  per dtype; its rate sizes a square ``n x n @ n x n`` matmul (``torch.mm`` into a
  preallocated output, ``2 n^3`` FLOPs, n at most 2048) so that a warm-up and five runs
  fit the phase's budget; the best (shortest) run counts. This is an achievable dense
  peak of torch's CPU kernels, not a vendor figure, so an MFU computed against it is an
  MFU against what torch can reach on this machine. A dtype whose probe runs at less
  than a quarter of fp32's rate has no vectorised kernel here (bf16 on a CPU without
  AVX-512 BF16 or AMX: torch's generic GEMM) and is stored as ``"emulated"`` in
  ``kernels``; its peak is its real rate, at the side that fits the budget, so the
  planner and ``shardlab train --dtype bf16`` treat it as slow.
* **memory bandwidth** (bytes/s): ``dst.copy_(src)`` of a large tensor (256 MiB by default,
  far beyond any cache), counted as ``2 x size`` bytes (read + write) per copy; best run.
  The **copy bandwidth** (bytes copied per second, half of that) is what one process can
  hand to another through shared memory at best, and is the bandwidth of the loopback
  link the measured accelerator gets.
* **one thread** (``single_thread``): the fp32 peak of an n/2-square ``torch.mm`` on one
  thread, and the three matmuls of a linear layer's forward and backward (x·wᵀ, dy·w,
  dyᵀ·x) at the shapes of small training runs (:data:`LINEAR_SHAPES`), 6·t·k·n FLOPs
  each, cycling through copies of the operands that together exceed the caches
  (:data:`COLD_BYTES`), as a training step's matmuls find them. When ``shardlab
  train`` runs one process per core, each process runs one thread:
  the planner then uses these (:func:`shardlab.plan.search.device_of`). They are steady
  under load, where a thread pool's figures are not (its threads wait for a core another
  job holds: a 64-square matmul on 2 threads measured 70 MFLOP/s on a loaded machine,
  on one thread 127 GFLOP/s).
* **one operator's fixed cost** (s): a one-element ``torch.add``, without autograd
  (``op_seconds``) and with it recording (``op_seconds_autograd``); and one thread's
  forward + backward of a tiny shardlab layer (d = 16, 4 tokens: ``layer_seconds``),
  the fixed cost of a layer as eager training runs it, which a one-thread plan shares
  out over the operators it counts per layer.
* **memory** (bytes): ``MemTotal`` of ``/proc/meminfo`` (or ``os.sysconf`` where there is
  no ``/proc``), lowered to the cgroup v2 limit ``/sys/fs/cgroup/memory.max`` when one is set.

**Power is not measured**: ``power_watts`` is 0, meaning unknown, and energy figures
computed from it (``estimate.timing.train_time``: device-hours x watts) come out 0.

The file goes to ``$SHARDLAB_HOME/cpu.json``, or ``~/.cache/shardlab/cpu.json`` when
``SHARDLAB_HOME`` is unset (:func:`save_measurement`, atomically). It records no host
name. Reading it needs no torch: :mod:`shardlab.config.measured`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import torch

from shardlab.calibrate.budget import HARD_CAP, Phases, best_seconds, matmul_side
from shardlab.config.host import cpu_model, memory_bytes
from shardlab.config.measured import NAME, PROBE, SCHEMA
from shardlab.config.model import ModelShape
from shardlab.errors import require_positive_int, require_positive_number
from shardlab.nn.model import Block, attention_mask, rope_tables
from shardlab.units import human

_METHOD = (
    "each phase has its own share of the budget; peak_flops: a probe at n = 256 per dtype "
    "sizes the timed square torch.mm (at most matmul_n, 2 n^3 FLOPs each, its warm-up and "
    "5 runs within the phase's budget), the best run counts; a dtype under 1/4 of fp32's "
    "probe rate is marked emulated; memory_bandwidth: best repeated dst.copy_(src) of "
    "copy_bytes, counted as 2 x copy_bytes (read + write) per copy; copy_bandwidth = "
    "memory_bandwidth / 2; memory_bytes: MemTotal (/proc/meminfo or os.sysconf), capped by "
    "the cgroup v2 memory.max; power_watts 0 = unknown (not measured)"
)


DEFAULT_SECONDS = 6.0
"""The in-process measurement's whole budget (s) by default (``--seconds``)."""

BUDGET_SHARES = {"probe": 0.04, "fp32 peak": 0.15, "bf16 peak": 0.12, "bandwidth": 0.06,
                 "sweep": 0.08, "operator": 0.04, "one thread": 0.1, "linear sweep": 0.31,
                 "layer": 0.1}
"""Each phase's share of ``seconds`` (they add up to 1)."""

PEAK_RUNS = 5
"""Timed runs each peak's matmul side is sized for (the best one counts).

Best-of-N is the usual way to time a peak: on a shared machine a run can only be slowed
by other jobs, never sped up, so the fastest of several is the closest to the machine's
own figure (one run under load measured 28 GFLOP/s where an idle one measured 287)."""

PROBE_N = 256
"""The side of each dtype's probe matmul, which sizes its peak run."""

EMULATED_BELOW = 0.25
"""A dtype whose probe reaches less than this fraction of fp32's rate at the same side runs
an emulated kernel here. torch's generic bf16 GEMM, the path of a CPU without native bf16,
measured 1.6 GFLOP/s against fp32's 86 at n = 256 on one thread (0.02); with AVX-512 BF16
and AMX, bf16 measured 2.2x fp32 at the same side."""

SWEEP_SIZES = (64, 128, 256, 512)
"""Sides n of the smaller fp32 matmuls timed for the planner's efficiency curve."""

LINEAR_SHAPES = ((128, 256, 1024), (256, 256, 256), (256, 256, 1024), (1024, 256, 768),
                 (1024, 1024, 256), (1024, 256, 1024), (2048, 512, 512), (2048, 128, 256))
"""(tokens t, in features k, out features n) of the one-thread linear-layer sweep."""


COLD_BYTES = 32 * 2**20
"""Bytes one pass of the linear-layer sweep streams (several copies of each shape's
operands), 8x this machine's 4 MiB L2: the matmuls of a training step find their
operands in memory, not in a cache the previous call warmed."""


# -- where the file lives --------------------------------------------------------------------




# -- the measurement (torch) -----------------------------------------------------------------






def measure_cpu(seconds: float = DEFAULT_SECONDS, threads: int | None = None, *,
                matmul_n: int = 2048, copy_bytes: int = 256 * 2**20,
                phases: Phases | None = None, mm: Callable[..., Any] | None = None
                ) -> dict[str, Any]:
    """Time matmuls, a memory copy and eager torch's fixed costs on this CPU; return a
    JSON-ready document.

    ``seconds``: the whole time budget (s), shared out over the phases by
    :data:`BUDGET_SHARES`; each phase stops at its own budget, and each large matmul is
    sized from a small probe of its dtype first (:mod:`shardlab.calibrate.budget`), so
    a dtype without a fast kernel here (bf16 on a CPU without AVX-512 BF16 or AMX) costs
    its share of the budget, not minutes. ``threads``: torch intra-op threads (``None``:
    torch's current setting; restored afterwards). ``matmul_n``: the largest matmul side
    (2 n^3 FLOPs per matmul). ``copy_bytes``: size of the copied tensor (the default
    256 MiB is beyond any cache). ``phases``: where the phases are recorded and shown (a
    progress display). ``mm``: the matmul timed (default ``torch.mm``; tests slow it down
    to stand in for a CPU without a fast kernel).

    Returns a dict with ``name`` ("cpu (measured)"), ``peak_flops`` {"fp32", "bf16"} in
    FLOP/s, ``peak_matmul_n`` (the side each dtype was timed at), ``kernels`` (per dtype:
    "native" or "emulated"), ``memory_bytes``, ``memory_bandwidth`` (read + write bytes/s),
    ``copy_bandwidth`` (bytes copied/s), ``power_watts`` (0 = unknown), ``threads``,
    ``torch``, ``date`` (UTC, ISO 8601), ``cpu_model``, ``phases`` (each with its budget and
    the seconds it took) and a ``method`` line. No host name.
    """
    seconds = require_positive_number("seconds", seconds)
    matmul_n = require_positive_int("matmul_n", matmul_n)
    copy_bytes = require_positive_int("copy_bytes", copy_bytes)
    if threads is not None:
        threads = require_positive_int("threads", threads)

    mm = mm or torch.mm
    log = phases if phases is not None else Phases()
    share = {k: seconds * v for k, v in BUDGET_SHARES.items()}
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)

    def square(n: int, dtype: Any) -> tuple[Any, Any]:
        a = torch.randn(n, n, generator=gen).to(dtype)
        return a, torch.empty(n, n, dtype=dtype)

    try:
        used_threads = torch.get_num_threads()
        torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        with torch.inference_mode():
            # Each dtype at a small side first: its rate sizes the peak run below, and a
            # dtype far slower than fp32 at the same side has no vectorised kernel here.
            with log.phase("probe", share["probe"]) as ph:
                n0 = min(PROBE_N, matmul_n)
                probe: dict[str, float] = {}
                for key, dtype in torch_dtypes.items():
                    a, c = square(n0, dtype)
                    t, _ = best_seconds(lambda a=a, c=c: mm(a, a, out=c),
                                        share["probe"] / len(torch_dtypes))
                    probe[key] = 2.0 * n0**3 / t
                kernels = {k: "emulated" if probe[k] < EMULATED_BELOW * probe["fp32"]
                           else "native" for k in probe}
                ph.figure = "; ".join(f"{k} {human(r, 'FLOP/s')} at n = {n0}" + (
                    " (emulated: no fast kernel)" if kernels[k] == "emulated" else "")
                    for k, r in probe.items())
            peaks: dict[str, float] = {}
            sides: dict[str, int] = {}
            for key, dtype in torch_dtypes.items():
                budget = share[f"{key} peak"]
                with log.phase(f"{key} peak", budget) as ph:
                    n = matmul_side(probe[key], budget, PEAK_RUNS, matmul_n)
                    a, c = square(n, dtype)
                    t, runs = best_seconds(lambda a=a, c=c: mm(a, a, out=c), budget,
                                           min_runs=PEAK_RUNS)
                    peaks[key], sides[key] = 2.0 * n**3 / t, n
                    ph.figure = (f"{human(peaks[key], 'FLOP/s')} (n = {n}, best of {runs}"
                                 + (", emulated kernel" if kernels[key] == "emulated" else "")
                                 + ")")
            with log.phase("bandwidth", share["bandwidth"]) as ph:
                src = torch.ones(max(1, copy_bytes // 4), dtype=torch.float32)
                dst = torch.empty_like(src)
                t, runs = best_seconds(lambda src=src, dst=dst: dst.copy_(src),
                                       share["bandwidth"],
                                       min_runs=PEAK_RUNS)
                moved = src.numel() * src.element_size()
                bandwidth = 2.0 * moved / t
                ph.figure = f"{bandwidth / 1e9:,.1f} GB/s read + write (best of {runs})"
            # The planner's efficiency curve: fp32 matmuls smaller than the peak's.
            with log.phase("sweep", share["sweep"]) as ph:
                small: dict[str, float] = {}
                for n in SWEEP_SIZES:
                    a, c = square(n, torch.float32)
                    t, _ = best_seconds(lambda a=a, c=c: mm(a, a, out=c),
                                        share["sweep"] / len(SWEEP_SIZES), min_runs=PEAK_RUNS)
                    small[str(n)] = 2.0 * n**3 / t
                ph.figure = ", ".join(f"{n}: {human(r, 'FLOP/s')}" for n, r in small.items())
        # The fixed cost of one tiny operator, without autograd and as training runs it
        # (autograd records a graph node per call).
        with log.phase("operator", share["operator"]) as ph:
            x = torch.ones(1)
            with torch.inference_mode():
                op_seconds, _ = best_seconds(lambda: torch.add(x, x), share["operator"] / 2,
                                             min_runs=50)
            xg = torch.ones(1, requires_grad=True)
            op_train, _ = best_seconds(lambda: torch.add(xg, xg), share["operator"] / 2,
                                       min_runs=50)
            ph.figure = (f"{op_seconds * 1e6:.1f} µs, {op_train * 1e6:.1f} µs with autograd "
                         "recording")
        # One thread, as each of several processes sharing the cores runs: no thread pool
        # waits on a core another job holds, so these are steady under load.
        torch.set_num_threads(1)
        with torch.inference_mode(), log.phase("one thread", share["one thread"]) as ph:
            n1 = matmul_side(probe["fp32"] / used_threads, share["one thread"], PEAK_RUNS,
                             max(1, matmul_n // 2))
            a, c = square(n1, torch.float32)
            t, _ = best_seconds(lambda a=a, c=c: mm(a, a, out=c), share["one thread"],
                                min_runs=PEAK_RUNS)
            peak1 = 2.0 * n1**3 / t
            ph.figure = f"fp32 {human(peak1, 'FLOP/s')} (n = {n1})"
        with torch.inference_mode(), log.phase("linear sweep", share["linear sweep"]) as ph:
            linear = _linear_sweep(gen, mm, share["linear sweep"])
            rates = sorted(r["flops_per_s"] for r in linear)
            ph.figure = (f"{len(linear)} of {len(LINEAR_SHAPES)} training shapes, "
                         f"{human(rates[0], 'FLOP/s')} to {human(rates[-1], 'FLOP/s')}")
        # The fixed cost of one layer's forward + backward as training runs it (eager
        # dispatch, autograd, Python), on tensors too small for their work to count; and
        # one real layer, whose memory-bound operators the planner prices from it.
        with log.phase("layer", share["layer"]) as ph:
            tiny = ModelShape("tiny", 1, 16, 2, vocab=16, context=4, style="llama",
                              tied=False, d_ff=32)
            block = Block(tiny, torch.float32)
            xt = torch.randn(1, 4, 16, generator=gen, requires_grad=True)
            tmask, trope = attention_mask(None, 4, xt.device), rope_tables(4, 8, torch.float32)
            layer_s, _ = best_seconds(lambda: block(xt, tmask, trope).sum().backward(),
                                      share["layer"] / 4, min_runs=20)
            shape = ModelShape("probe", 1, PROBE["d_model"], PROBE["heads"], vocab=16,
                               context=PROBE["seq"], style="llama", tied=False,
                               d_ff=PROBE["d_ff"])
            block = Block(shape, torch.float32)
            xp = torch.randn(PROBE["batch"], PROBE["seq"], PROBE["d_model"], generator=gen,
                             requires_grad=True)
            pmask = attention_mask(None, PROBE["seq"], xp.device)
            prope = rope_tables(PROBE["seq"], shape.head_dim, torch.float32)
            probe_s, _ = best_seconds(lambda: block(xp, pmask, prope).sum().backward(),
                                      share["layer"] * 3 / 4, min_runs=3)
            ph.figure = (f"tiny layer {layer_s * 1e3:.2f} ms, d = {PROBE['d_model']} layer "
                         f"{probe_s * 1e3:.1f} ms (forward + backward, one thread)")
        single = {"peak_fp32": peak1, "matmul_n": n1, "linear_sweep_fp32": linear,
                  "layer_seconds": layer_s, "layer_probe": {**PROBE, "seconds": probe_s}}
    finally:
        torch.set_num_threads(previous)

    memory, memory_source = memory_bytes()
    return {
        "schema": SCHEMA,
        "name": NAME,
        "peak_flops": peaks,
        "peak_matmul_n": sides,
        "kernels": kernels,
        "torch_bf16_kernel": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "memory_bytes": memory,
        "memory_source": memory_source,
        "memory_bandwidth": bandwidth,
        "copy_bandwidth": bandwidth / 2,
        "power_watts": 0.0,
        "power_note": "unknown, not measured: 0 W, so energy estimates come out 0",
        "threads": used_threads,
        "cpu_model": cpu_model(),
        "torch": str(torch.__version__),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": seconds,
        "matmul_n": sides["fp32"],
        "copy_bytes": moved,
        "method": _METHOD,
        "matmul_sweep_fp32": small,
        "op_seconds": op_seconds,
        "op_seconds_autograd": op_train,
        "single_thread": single,
        "phases": log.records(),
    }


def _linear_sweep(gen: Any, mm: Callable[..., Any], budget: float
                  ) -> list[dict[str, float]]:
    """The three matmuls of a linear layer's forward and backward as autograd runs them
    (y = x·wᵀ, dx = dy·w, dw = dyᵀ·x: transposed operands), 6·t·k·n FLOPs, at the shapes
    of small training runs (:data:`LINEAR_SHAPES`), each for an equal share of what is left
    of ``budget`` seconds; shapes left past :data:`HARD_CAP` x ``budget`` (a CPU whose fp32
    is far slower than usual) are skipped, two at least kept, the fewest the planner's fit
    takes."""
    start = time.perf_counter()
    out: list[dict[str, float]] = []
    for i, (tt, kk, nn) in enumerate(LINEAR_SHAPES):
        spent = time.perf_counter() - start
        if len(out) >= 2 and spent > HARD_CAP * budget:
            break
        # Enough copies that one pass streams COLD_BYTES: in a training step each
        # matmul's operands come from memory, not from a cache the previous call warmed
        # (hot, a 128-row matmul measured 133 GFLOP/s here; cold, 94).
        per_set = 8 * (tt * kk + nn * kk + tt * nn)  # operands + outputs, fp32
        sets = []
        for _ in range(max(2, math.ceil(COLD_BYTES / per_set))):
            x = torch.randn(tt, kk, generator=gen)
            w = torch.randn(nn, kk, generator=gen)
            dy = torch.randn(tt, nn, generator=gen)
            sets.append((x, w, dy, torch.empty(tt, nn), torch.empty(tt, kk),
                         torch.empty(nn, kk)))

        def fwd_bwd(sets: list[tuple[Any, ...]] = sets) -> None:
            for x, w, dy, y, dx, dw in sets:
                mm(x, w.t(), out=y)
                mm(dy, w, out=dx)
                mm(dy.t(), x, out=dw)

        t, _ = best_seconds(fwd_bwd, max(budget - spent, 0.0) / (len(LINEAR_SHAPES) - i),
                            min_runs=3)
        out.append({"t": tt, "k": kk, "n": nn, "flops_per_s": 6.0 * tt * kk * nn * len(sets) / t})
    return out


# -- storing and reading ---------------------------------------------------------------------




















