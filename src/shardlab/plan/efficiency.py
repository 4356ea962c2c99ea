"""How long a matmul takes: the dense peak times an efficiency that depends on the matmul's size.

One constant MFU cannot rank layouts: tensor parallelism makes every matmul thinner
(N/t columns), a small micro-batch makes it shorter (M = b·s rows), and both lower
the fraction of the peak a GPU reaches. shardlab uses a two-number saturating curve
per accelerator (:class:`shardlab.config.hardware.Efficiency`):

    fraction(I) = peak_fraction · I / (I + half_intensity)
    I = 1 / (1/M + 1/K + 1/N)      (FLOPs per byte at 2-byte elements)

I is the arithmetic intensity of [M, K] x [K, N]: 2MKN FLOPs over 2(MK + KN + MN)
bytes. Far below ``half_intensity`` the matmul is memory-bound and its time grows
with the bytes it moves (the roofline, Williams, Waterman & Patterson 2009); far
above it the matmul reaches ``peak_fraction`` of the dense peak. The curve is
calibrated per accelerator on published runs (``docs/validation.md``).

An accelerator without a curve gets :data:`DEFAULT`; the measured CPU gets
:func:`cpu_efficiency`.
"""

from __future__ import annotations

import numpy as np

from shardlab.config.hardware import A100_EFFICIENCY, Accelerator, Efficiency

DEFAULT = Efficiency(
    0.5, A100_EFFICIENCY.half_intensity, A100_EFFICIENCY.op_overhead,
    A100_EFFICIENCY.link_fraction,
    "assumed for an accelerator without a calibrated curve: half the dense peak for large "
    "matmuls; the A100 fit's half_intensity, cost per launch and link fraction (the H100 "
    "curve takes the same three)")

CPU_DEFAULT = Efficiency(
    1.0, 16.0, 20e-6, 1.0,
    "assumed for the measured CPU: its peak is already what torch.mm reaches at n = 2048 "
    "(I = 683), so peak_fraction 1; small matmuls lose to memory at 16 FLOP/byte; 20 µs of "
    "eager dispatch per operator; the loopback link's measured copy rate as is")


def efficiency_of(acc: Accelerator) -> Efficiency:
    """The accelerator's calibrated curve, else :data:`CPU_DEFAULT` for a measured CPU (it has
    one device per node and no power figure), else :data:`DEFAULT`."""
    if acc.efficiency is not None:
        return acc.efficiency
    if acc.name.startswith("cpu"):
        return CPU_DEFAULT
    return DEFAULT


def matmul_intensity(m: np.ndarray | float, k: np.ndarray | float,
                     n: np.ndarray | float) -> np.ndarray:
    """Arithmetic intensity of [m, k] x [k, n] at 2-byte elements: 1/(1/m + 1/k + 1/n) FLOP/B."""
    return 1.0 / (1.0 / np.asarray(m, float) + 1.0 / np.asarray(k, float)
                  + 1.0 / np.asarray(n, float))


def fraction_of_peak(intensity: np.ndarray | float, eff: Efficiency) -> np.ndarray:
    """peak_fraction · I / (I + half_intensity): the share of the dense peak reached."""
    i = np.asarray(intensity, float)
    return eff.peak_fraction * i / (i + eff.half_intensity)


def matmul_seconds(flops: np.ndarray | float, m: np.ndarray | float, k: np.ndarray | float,
                   n: np.ndarray | float, peak: float, eff: Efficiency) -> np.ndarray:
    """Seconds of ``flops`` FLOPs of matmuls shaped [m, k] x [k, n] on a ``peak`` FLOP/s device."""
    return np.asarray(flops, float) / (peak * fraction_of_peak(matmul_intensity(m, k, n), eff))
