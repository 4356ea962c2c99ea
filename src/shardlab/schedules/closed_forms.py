"""The papers' closed forms for bubble and in-flight micro-batches, to hold the simulator to.

Uniform per-stage costs, zero latency; t_f forward, t_b input-gradient backward,
t_w weight-gradient backward (a full backward is t_b + t_w), all per model chunk.

* GPipe and 1F1B: bubble (p-1)/(m+p-1) of the makespan (Huang et al. 2019;
  Narayanan et al. 2021).
* Interleaved 1F1B with v chunks: the bubble shrinks by v, (p-1)/(v·m + p - 1)
  (Narayanan et al. 2021, Sec. 2.2).
* ZB-H1: each rank idles (p-1)(t_f + t_b - t_w) (Qi et al. 2024, Sec. 3.1).
* ZB-H2: each rank idles (p-1)(t_f + t_b - 2t_w), zero when t_w >= (t_f + t_b)/2
  inside its own span; the ranks start and end staggered by one forward each.

Overall fractions are idle rank-time over ranks x makespan; per-rank ones use the
rank's own span.
"""

from __future__ import annotations


def bubble_1f1b(p: int, m: int) -> float:
    """GPipe and 1F1B: (p-1)/(m+p-1) of the makespan, every rank alike."""
    return (p - 1) / (m + p - 1)


def bubble_interleaved(p: int, m: int, v: int) -> float:
    """Interleaved 1F1B, v chunks per rank: (p-1)/(v·m + p - 1)."""
    return (p - 1) / (v * m + p - 1)


def zb_h1_idle(p: int, t_f: float, t_b: float, t_w: float) -> float:
    """ZB-H1: idle time inside the first rank's span, (p-1)(t_f + t_b - t_w)."""
    return float((p - 1) * (t_f + t_b - t_w))


def zb_h2_idle(p: int, t_f: float, t_b: float, t_w: float) -> float:
    """ZB-H2: idle time inside each rank's span, (p-1)(t_f + t_b - 2t_w), not below 0."""
    return max(0.0, float((p - 1) * (t_f + t_b - 2 * t_w)))


def zb_overall_bubble(p: int, m: int) -> float:
    """ZB-H1 and ZB-H2 with t_f = t_b = t_w: the makespan is 3m + p - 1 units, so the
    idle share of ranks x makespan is (p-1)/(3m + p - 1)."""
    return (p - 1) / (3 * m + p - 1)
