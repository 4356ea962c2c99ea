"""This machine's stored measurement, read as an accelerator: the file ``shardlab hardware
--measure`` writes (:mod:`shardlab.calibrate.cpu` makes it; this module only reads it).

The file is ``$SHARDLAB_HOME/cpu.json``, or ``~/.cache/shardlab/cpu.json`` when
``SHARDLAB_HOME`` is unset: one JSON object of schema :data:`SCHEMA` with the measured peak
FLOP/s per dtype (and which dtypes run an emulated kernel), memory bytes and bandwidth, the
one-thread figures and, when measured, the 2-rank runtime (:mod:`shardlab.config.runtime`).
:func:`load_measurement` turns it into an :class:`~shardlab.config.hardware.Accelerator`
named :data:`NAME`; a file that is not that is a SpecError naming it. No torch here.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from shardlab.config.hardware import (
    MEASURED_NAMES,
    OPS_PER_LAYER_FORWARD,
    Accelerator,
    Efficiency,
    Link,
)
from shardlab.config.hardware_file import find_accelerator
from shardlab.config.runtime import parse_runtime
from shardlab.errors import SpecError
from shardlab.units import human

NAME = MEASURED_NAMES[1]
"""The accelerator name a stored measurement is listed and looked up under: "cpu (measured)"."""

NAMES = MEASURED_NAMES
"""Names (case-insensitive) that :func:`accelerator_or_measured` resolves to the measurement."""

SCHEMA = "shardlab.cpu-measurement/1"
"""The ``schema`` field of the stored JSON document."""

LOOPBACK_LATENCY = 0.15e-3
"""Seconds: a small message between processes on one host, assumed, not measured.

About 0.15 ms for a 4-byte gloo all-reduce over loopback, 2 ranks, on a 2-core
machine (``shared/REFERENCE.md``, "Collectives")."""

LOOPBACK_NAME = "loopback (shared memory)"

_LOOPBACK_SOURCE = (
    "one host, process to process: bandwidth = measured copy rate (bytes copied/s, an upper "
    "bound: gloo over loopback reaches about 1.4-1.7 GB/s algBw on a 2-core machine); "
    "latency 0.15 ms assumed (a 4-byte gloo all-reduce, shared/REFERENCE.md)"
)

DTYPES = ("fp32", "bf16")

PROBE = {"batch": 8, "seq": 128, "d_model": 256, "heads": 4, "d_ff": 1024}
"""The llama-style layer timed forward + backward on one thread (``layer_probe``)."""

def measurement_path() -> Path:
    """``$SHARDLAB_HOME/cpu.json``, or ``~/.cache/shardlab/cpu.json`` when it is unset or empty."""
    home = os.environ.get("SHARDLAB_HOME", "").strip()
    base = Path(home).expanduser() if home else Path.home() / ".cache" / "shardlab"
    return base / "cpu.json"

def _bad(target: Path, what: str) -> SpecError:
    return SpecError("measurement_file", str(target),
                     f"{what}; run `shardlab hardware --measure` again")

def _number(target: Path, doc: dict[str, Any], key: str, allow_zero: bool = False,
            prefix: str = "") -> float:
    value = doc.get(key)
    ok = (not isinstance(value, bool) and isinstance(value, int | float)
          and math.isfinite(value) and (value > 0 or (allow_zero and value == 0)))
    if not ok:
        need = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise _bad(target, f"{prefix}{key} must be {need} (got {value!r})")
    return float(value)

def measurement_link(copy_bandwidth: float) -> Link:
    """The loopback link of the measured CPU: copy rate (bytes/s), 0.15 ms latency assumed."""
    return Link(LOOPBACK_NAME, copy_bandwidth, LOOPBACK_LATENCY, _LOOPBACK_SOURCE)

def load_measurement(path: str | Path | None = None) -> Accelerator | None:
    """The stored measurement as an :class:`Accelerator`, or None when there is no file.

    ``path`` defaults to :func:`measurement_path`. Peaks (FLOP/s), memory (bytes) and
    memory bandwidth (read + write bytes/s) are the measured figures; power is 0 W
    (unknown); both links are the loopback link of :func:`measurement_link`;
    ``gpus_per_node`` is 1 (the whole CPU, with the measured thread count, is one
    device). A file that is not JSON, or lacks or has a bad field, is a SpecError
    naming the file.
    """
    target = Path(path) if path is not None else measurement_path()
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _bad(target, f"cannot be read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise _bad(target, "is not UTF-8 text") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise _bad(target, f"is not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise _bad(target, "must hold one JSON object")
    if doc.get("schema") != SCHEMA:
        raise _bad(target, f"schema must be {SCHEMA!r} (got {doc.get('schema')!r})")
    flops = doc.get("peak_flops")
    if not isinstance(flops, dict):
        raise _bad(target, f"peak_flops must be an object of dtype: FLOP/s (got {flops!r})")
    missing = [k for k in DTYPES if k not in flops]
    if missing:
        raise _bad(target, f"peak_flops lacks {', '.join(missing)}")
    peaks = {str(k): _number(target, flops, k, prefix="peak_flops.") for k in flops}
    memory_bandwidth = _number(target, doc, "memory_bandwidth")
    copy_bandwidth = (_number(target, doc, "copy_bandwidth") if "copy_bandwidth" in doc
                      else memory_bandwidth / 2)
    threads = doc.get("threads")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise _bad(target, f"threads must be a positive integer (got {threads!r})")
    link = measurement_link(copy_bandwidth)
    source = (f"measured on this machine ({doc.get('cpu_model') or 'CPU'}, {threads} threads, "
              f"torch {doc.get('torch', '?')}, {doc.get('date', '?')}): best-of torch.mm per "
              f"dtype and tensor copy_; power unknown (0 W); file {target}")
    single = doc.get("single_thread")
    single_thread = None
    if isinstance(single, dict) and single:
        single_thread = _single_thread(target, doc, single)
    kernels = doc.get("kernels")
    return Accelerator(
        emulated=tuple(k for k, v in kernels.items() if v == "emulated" and k in peaks)
        if isinstance(kernels, dict) else (),
        single_thread=single_thread,
        layer_probe=_layer_probe(single),
        runtime=parse_runtime(doc["runtime"]) if "runtime" in doc else None,
        efficiency=_efficiency(doc, peaks, matmul_n=doc.get("matmul_n", 2048)),
        name=NAME,
        peak_flops=peaks,
        memory_bytes=_number(target, doc, "memory_bytes"),
        memory_bandwidth=memory_bandwidth,
        power_watts=_number(target, doc, "power_watts", allow_zero=True),
        intra_link=link,
        inter_link=link,
        gpus_per_node=1,
        source=source,
    )

def _efficiency(doc: dict[str, Any], peaks: dict[str, float], matmul_n: object
                ) -> Efficiency | None:
    """The planner's efficiency curve from the stored fp32 sweep (None for older files).

    fraction(I) = peak_fraction · I/(I + half_intensity) (:class:`Efficiency`), with the
    curve through the n x n peak matmul (I_p = n/3, fraction 1 of the measured peak) and
    each swept k x k matmul (I_k = k/3, fraction f_k) has half_intensity
    h = I_k·I_p·(1 - f_k) / (f_k·I_p - I_k); the median over sizes is kept, and
    peak_fraction = (I_p + h)/I_p. ``op_overhead`` is the measured time of one tiny operator
    as training runs it (autograd recording), or without autograd in older files.
    """
    sweep = doc.get("matmul_sweep_fp32")
    op = doc.get("op_seconds_autograd", doc.get("op_seconds"))
    if not isinstance(sweep, dict) or not sweep or not isinstance(op, int | float) or op <= 0:
        return None
    n = float(matmul_n) if isinstance(matmul_n, int | float) and matmul_n > 0 else 2048.0
    i_peak = n / 3
    halves = []
    for k, flops in sweep.items():
        try:
            i_k, f_k = float(k) / 3, float(flops) / peaks["fp32"]
        except (TypeError, ValueError):
            continue
        # The curve through (I_peak, 1) and (I_k, f_k): f_k·I_p·(I_k + h) = I_k·(I_p + h).
        # A size at or above the peak (cache-resident on one thread) gives a flat curve, h = 0.
        denom = i_peak * f_k - i_k
        if f_k >= 1:
            halves.append(0.0)
        elif f_k > 0 and denom > 0:
            halves.append(i_k * i_peak * (1 - f_k) / denom)
    if not halves:
        return None
    half = sorted(halves)[len(halves) // 2]
    return Efficiency((i_peak + half) / i_peak, half, float(op), 1.0,
                      f"measured on this machine: fp32 torch.mm at n = "
                      f"{', '.join(sorted(sweep, key=float))} against n = {int(n)}; one tiny "
                      f"operator {float(op) * 1e6:.1f} µs")

def _layer_probe(single: object) -> dict[str, float] | None:
    """The stored one-thread layer timing, or None when absent or not all positive numbers."""
    probe = single.get("layer_probe") if isinstance(single, dict) else None
    keys = (*PROBE, "seconds")
    if not isinstance(probe, dict) or any(
            isinstance(probe.get(k), bool) or not isinstance(probe.get(k), int | float)
            or not math.isfinite(probe[k]) or probe[k] <= 0 for k in keys):
        return None
    return {k: float(probe[k]) for k in keys}

def _single_thread(target: Path, doc: dict[str, Any], single: dict[str, Any]
                   ) -> tuple[float, Efficiency] | None:
    """(fp32 FLOP/s, efficiency curve) of one thread, or None.

    The curve is fitted to the linear-layer sweep: with f = rate / peak and I the
    planner's intensity 1/(1/t + 1/k + 1/n), ``peak_fraction · I/(I + half_intensity)``
    means 1/f = (1 + half_intensity/I) / peak_fraction, a straight line in 1/I: its
    least-squares fit gives both numbers (half_intensity at least 0).
    """
    try:
        peak = _number(target, single, "peak_fp32", prefix="single_thread.")
        rows = [(1.0 / (1.0 / r["t"] + 1.0 / r["k"] + 1.0 / r["n"]), r["flops_per_s"] / peak)
                for r in single["linear_sweep_fp32"]]
    except (SpecError, KeyError, TypeError, ZeroDivisionError):
        return None
    if len(rows) < 2 or any(f <= 0 for _, f in rows):
        return None
    xs = [1.0 / i for i, _ in rows]
    ys = [1.0 / f for _, f in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    slope = max(slope, 0.0)
    intercept = my - slope * mx if slope > 0 else my
    if intercept <= 0:
        return None
    op = doc.get("op_seconds_autograd", doc.get("op_seconds"))
    op = float(op) if isinstance(op, int | float) and op > 0 else 0.0
    layer = single.get("layer_seconds")
    if isinstance(layer, int | float) and layer > 0:
        # The planner charges 3 x OPS_PER_LAYER_FORWARD launches per layer and micro-batch:
        # the measured tiny layer's fixed cost, shared out over them.
        op = max(op, float(layer) / (3 * OPS_PER_LAYER_FORWARD))
    eff = Efficiency(1.0 / intercept, slope / intercept, op, 1.0,
                     f"measured on this machine, one thread: linear-layer forward + backward "
                     f"matmuls at {len(rows)} training shapes against a {single.get('matmul_n')}"
                     f"-square torch.mm; {op * 1e6:.1f} µs per operator (a tiny layer's "
                     f"forward + backward over the planner's operator count)")
    return peak, eff

def slow_dtype_note(acc: Accelerator, dtype: str) -> str | None:
    """A line saying that ``dtype`` runs an emulated matmul on this measured CPU (with its
    measured rate against fp32's), or None when it does not."""
    if dtype not in acc.emulated or "fp32" not in acc.peak_flops:
        return None
    rate = acc.peak(dtype)
    return (f"{dtype} matmuls run torch's emulated kernel on this CPU ({human(rate, 'FLOP/s')} "
            f"measured, x{rate / acc.peak('fp32'):.3f} of fp32): fp32 is the fast path here")

def accelerator_or_measured(name: str, hardware_file: str | Path | None = None,
                            path: str | Path | None = None) -> Accelerator:
    """``name`` as an accelerator: "cpu" / "cpu (measured)" is the stored measurement.

    Those two names (any case) read :func:`load_measurement` (``path`` as there); no
    stored measurement is a SpecError telling to run ``shardlab hardware --measure``.
    Every other name goes to :func:`shardlab.config.hardware_file.find_accelerator`.
    """
    if name.strip().lower() in NAMES:
        acc = load_measurement(path)
        if acc is None:
            where = Path(path) if path is not None else measurement_path()
            raise SpecError("gpu", name, f"no stored CPU measurement at {where}: run "
                            "`shardlab hardware --measure` first")
        return acc
    return find_accelerator(name, hardware_file)
