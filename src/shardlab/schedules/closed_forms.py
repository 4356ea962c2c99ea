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

Unequal stages (uneven layer counts, or the embedding and head): GPipe's forwards run
through the (stage, micro-batch) grid in order, so the last one ends at the longest path
through it, down the stages and across the micro-batches, which crosses m-1 of them on
the slowest stage: sum F_s + (m-1)·max F_s; the backwards then do the same upwards,
sum B_s + (m-1)·max B_s (checked against the timing simulator on random stage costs).
The slowest stage sets the pace, so the bubble grows with the spread. 1F1B has no such
closed form in general (its ranks wait on each other inside the steady state): the
timing simulator gives it.
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


def gpipe_makespan(forward: list[float], backward: list[float], m: int) -> float:
    """GPipe with per-stage forward and full-backward times, no latency:
    sum F + sum B + (m-1)·(max F + max B) (module docstring)."""
    return sum(forward) + sum(backward) + (m - 1) * (max(forward) + max(backward))
