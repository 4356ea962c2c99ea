"""Seconds of the collectives a layout runs, vectorised over layouts (alpha-beta, ring).

Ring algorithms on p ranks and an n-byte buffer (Thakur, Rabenseifner & Gropp 2005),
α the link latency, B its bandwidth times the fraction collectives reach
(:class:`shardlab.config.hardware.Efficiency`):

* all-reduce: 2(p-1)·α + 2·(p-1)/p·n/B;
* reduce-scatter or all-gather: (p-1)·α + (p-1)/p·n/B;
* point-to-point send: α + n/B.

These are the formulas of :mod:`shardlab.estimate.comm`, over numpy arrays so that a
search times every layout at once. Which link a group uses follows Megatron-LM's rank
order (tensor fastest, then data, then pipeline; Narayanan et al. 2021): a tensor
group stays in a node while t <= devices per node, a data group while t·d does, and
neighbouring pipeline stages share a node only when the whole job fits in one.
"""

from __future__ import annotations

import numpy as np

from shardlab.config.hardware import Link


def _arr(x: np.ndarray | float) -> np.ndarray:
    return np.asarray(x, float)


def allreduce_seconds(nbytes: np.ndarray | float, p: np.ndarray | int, latency: np.ndarray,
                      bandwidth: np.ndarray) -> np.ndarray:
    """Ring all-reduce: 2(p-1)α + 2(p-1)/p·n/B; 0 for p = 1."""
    p = _arr(p)
    t = 2 * (p - 1) * latency + 2 * (p - 1) / p * _arr(nbytes) / bandwidth
    return np.where(p > 1, t, 0.0)


def gather_seconds(nbytes: np.ndarray | float, p: np.ndarray | int, latency: np.ndarray,
                   bandwidth: np.ndarray) -> np.ndarray:
    """Ring reduce-scatter or all-gather: (p-1)α + (p-1)/p·n/B; 0 for p = 1."""
    p = _arr(p)
    t = (p - 1) * latency + (p - 1) / p * _arr(nbytes) / bandwidth
    return np.where(p > 1, t, 0.0)


def send_seconds(nbytes: np.ndarray | float, latency: np.ndarray,
                 bandwidth: np.ndarray) -> np.ndarray:
    """One point-to-point message: α + n/B."""
    return latency + _arr(nbytes) / bandwidth


def pick_link(inside: np.ndarray, intra: Link, inter: Link,
              link_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(latency, achievable bandwidth) per layout: the intra-node link where ``inside``."""
    latency = np.where(inside, intra.latency, inter.latency)
    bandwidth = np.where(inside, intra.bandwidth, inter.bandwidth) * link_fraction
    return latency, bandwidth
