"""Does this GPU's fp8 matmul follow the curve the planner gives it? The planner prices an
fp8 linear matmul on the bf16 curve with its share x FP8_PEAK_RATIO and its half-intensity x
FP8_HALF_RATIO (config/hardware.py, from TileLang's H800 benchmarks); this measures both on
cuBLAS, side by side in one run:

    python benchmarks/fp8_curve.py [--gpu h100] [--json OUT]

For M = N = 8192 and K = 256 ... 16384: torch.mm in bf16 and torch._scaled_mm in fp8 e4m3
(tensorwise scales, bf16 out), the median of CUDA-event timings, each as a share of the
catalog's dense peak; then ``P · I/(I + h)`` fitted to each (least squares over h, P
closed-form), I = 1/(1/M + 1/K + 1/N), and the two ratios beside the catalog's. A machine
without a CUDA GPU with fp8 tensor cores (compute capability 8.9 or newer) gets one line
and exit 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import numpy as np
import torch

from shardlab.config.hardware import FP8_HALF_RATIO, FP8_PEAK_RATIO, get_accelerator

M = N = 8192
KS = (256, 512, 1024, 2048, 4096, 8192, 16384)


def median_seconds(fn: Callable[[], object], repeats: int = 20, warmup: int = 5) -> float:
    """Median seconds of ``fn()`` on the current CUDA stream (CUDA events)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def fit_curve(intensity: np.ndarray, share: np.ndarray) -> tuple[float, float, float]:
    """(P, h, rms): ``P · I/(I + h)`` fitted to ``share`` (h on a grid of 0.5, P closed-form)."""
    best = (0.0, 0.0, float("inf"))
    for h in np.arange(0.0, 4000.0, 0.5):
        x = intensity / (intensity + h)
        p = float((x * share).sum() / (x * x).sum())
        rms = float(np.sqrt(np.mean((p * x - share) ** 2)))
        if rms < best[2]:
            best = (p, float(h), rms)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100", help="catalog accelerator whose peaks to use")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("fp8_curve: needs a CUDA GPU; this machine has none", file=sys.stderr)
        return 2
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        print(f"fp8_curve: needs fp8 tensor cores (compute capability 8.9 or newer); this GPU "
              f"is {cap[0]}.{cap[1]}", file=sys.stderr)
        return 2
    acc = get_accelerator(a.gpu)
    bf16_peak, fp8_peak = acc.peak("bf16"), acc.peak("fp8")
    one = torch.ones((), device="cuda", dtype=torch.float32)
    rows = []
    for k in KS:
        x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(k, N, device="cuda", dtype=torch.bfloat16)
        x8 = x.to(torch.float8_e4m3fn)
        w8 = w.t().contiguous().t().to(torch.float8_e4m3fn)  # column-major, as cuBLASLt wants
        t16 = median_seconds(lambda x=x, w=w: torch.mm(x, w))
        t8 = median_seconds(lambda x8=x8, w8=w8: torch._scaled_mm(
            x8, w8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        flops = 2.0 * M * N * k
        rows.append({"k": k, "intensity": 1 / (1 / M + 1 / k + 1 / N),
                     "bf16_tflops": flops / t16 / 1e12, "fp8_tflops": flops / t8 / 1e12,
                     "bf16_share": flops / t16 / bf16_peak, "fp8_share": flops / t8 / fp8_peak})
    intensity = np.array([r["intensity"] for r in rows])
    p16, h16, rms16 = fit_curve(intensity, np.array([r["bf16_share"] for r in rows]))
    p8, h8, rms8 = fit_curve(intensity, np.array([r["fp8_share"] for r in rows]))
    print(f"{torch.cuda.get_device_name()}, peaks from the catalog's {acc.name}: "
          f"{bf16_peak / 1e12:.0f} (bf16) and {fp8_peak / 1e12:.0f} (fp8) TFLOP/s")
    print("     K   bf16 TFLOP/s  share   fp8 TFLOP/s  share   fp8/bf16")
    for r in rows:
        print(f"{r['k']:6d}  {r['bf16_tflops']:12.0f}  {r['bf16_share']:5.1%}  "
              f"{r['fp8_tflops']:11.0f}  {r['fp8_share']:5.1%}  "
              f"{r['fp8_tflops'] / r['bf16_tflops']:8.2f}")
    print(f"fit bf16: P {p16:.3f}, h {h16:.0f} (rms {rms16:.3f}); fp8: P {p8:.3f}, h {h8:.0f} "
          f"(rms {rms8:.3f})")
    print(f"measured ratios: share {p8 / p16:.3f} (catalog {FP8_PEAK_RATIO:.3f}), "
          f"half-intensity {h8 / max(h16, 1e-9):.2f} (catalog {FP8_HALF_RATIO:.2f})")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows,
                       "bf16_fit": [p16, h16, rms16], "fp8_fit": [p8, h8, rms8],
                       "peak_ratio": p8 / p16, "half_ratio": h8 / max(h16, 1e-9),
                       "catalog_peak_ratio": FP8_PEAK_RATIO,
                       "catalog_half_ratio": FP8_HALF_RATIO}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
