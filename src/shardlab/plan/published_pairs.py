"""Choosing between two ways to run one job, or two scales of it: the planner's ratio beside
the measured one.

A planner is used to choose: fp8 or bf16, async TP or not, one layout or another. What
that needs is not each step time but their ratio, and the published tables hold many
pairs of runs of one job measured side by side on one cluster with one software release:
the same source, model, accelerator (and stated part, power cap and network), device
count, sequence and global batch, differing in a choice (torchtitan's bf16 and fp8 rows,
its vanilla and async TP, its 1F1B and interleaved 405B; NVIDIA's bf16 and fp8
dgxc-benchmarking rows; the Megatron-MoE model zoo's four Qwen3-235B layouts;
Megatron-Bridge's Llama 3 70B pipelined and FSDP). A stack's own speed, what the held-out
table's single-run errors mostly measure, cancels in such a ratio.

For each pair (``b`` after ``a`` in the table's order; in a series below, ``b`` the larger
scale or batch) this module prices both as
:func:`shardlab.plan.published.predict` does and reports the measured ratio
``t_b / t_a``, the planner's, the ratio's error (predicted / measured - 1) and whether
the planner orders the two as measured. A pair whose measured times differ by less than
:data:`CLOSE` is called close: its order is within a rerun's noise, so it is not counted
for or against the planner (its ratio error still is). The rule and the 3% were fixed
before any pair was priced. Excluded and unverified runs are left out, calibration runs
are kept (the curve's one share per accelerator scales both runs of a pair alike).

How many devices to rent is a choice too. Runs of one source, model, accelerator, sequence
and dtype whose settings differ only in the data-parallel degree and the global batch
(MegaScale's 256 to 12,288 GPUs, NVIDIA's 128, 256 and 512 GB200s, MosaicML's tables) are
a series. Each run of a series is paired with the next one along each of three lines: more
devices at the same global batch (**strong** scaling), more devices at the same batch per
device (**weak** scaling), a larger global batch on the same devices (**batch**). The ratio
is of the cost of a sequence, GPU-seconds per sequence (t·N / global batch), which for two
runs of one job is t_b / t_a: above 1, the larger scale or batch trains less per GPU.

Several pairs of one group share a run (four runs give six pairs, three of them
independent), so the counts below are of pairs, not of independent measurements.

``python -m shardlab.plan.published_pairs`` prints the table of ``docs/validation.md``,
"Choosing between two runs of one job, and between two scales".
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardlab.plan.choice_kinds import CHOICES, kind_of
from shardlab.plan.published import RUNS, predict
from shardlab.plan.published_run import PublishedRun
from shardlab.plan.search import STEP_KEYS, parse_layout

CLOSE = 0.03
"""Measured times within this fraction of each other (|t_b / t_a - 1| < 3%) make a close
pair: its order is not scored."""


@dataclass(frozen=True)
class Pair:
    """Two runs of one job (``a`` first in the table) or of one series (``a`` the smaller
    scale or batch), what differs between them (``changes``: key -> (a's value, b's)), its
    ``kind`` and the measured and predicted ratios of b's cost to a's."""

    a: PublishedRun
    b: PublishedRun
    changes: dict[str, tuple[str, str]]
    kind: str
    measured: float
    predicted: float

    @property
    def ratio_error(self) -> float:
        """The planner's ratio over the measured one, less 1."""
        return self.predicted / self.measured - 1

    @property
    def close(self) -> bool:
        """Whether the measured times are within :data:`CLOSE` of each other."""
        return abs(self.measured - 1) < CLOSE

    @property
    def agrees(self) -> bool:
        """Whether the planner puts the faster run first as the measurement does (a
        predicted tie counts against it)."""
        return (self.predicted - 1) * (self.measured - 1) > 0


def settings(r: PublishedRun) -> dict[str, str]:
    """The run's choices as ``key=value`` pairs: its layout with its step-time keys (its
    ``layout_text``, read as ``--layout`` is), its dtype, device count and global batch."""
    return {**parse_layout(r.layout_text, STEP_KEYS), "dtype": r.dtype, "gpus": str(r.gpus),
            "global_batch": str(r.global_batch)}


def cost(r: PublishedRun, seconds: float) -> float:
    """GPU-seconds per sequence of ``r`` at a step of ``seconds``."""
    return seconds * r.gpus / r.global_batch


SCALE_KEYS = frozenset({"dp", "gpus", "global_batch"})
"""What a scale (or batch) series may change: nothing but these."""


def series(r: PublishedRun) -> tuple[object, ...]:
    """What the runs of a scale series share: :func:`job` without the device count and the
    global batch, and every setting but :data:`SCALE_KEYS`."""
    fixed = sorted((k, v) for k, v in settings(r).items() if k not in SCALE_KEYS)
    return (*_stack(r), r.seq, tuple(fixed))


def _stack(r: PublishedRun) -> tuple[object, ...]:
    """The source (stack and release), framework, attention convention, model and
    accelerator with its stated part, cap and network."""
    return (r.source, r.framework, r.flash, r.model, r.gpu, r.hardware, r.power_cap_w,
            r.nics_per_node, r.nic_gbps)


def job(r: PublishedRun) -> tuple[object, ...]:
    """What two runs must share to be one job run two ways: the source (stack and
    release), framework, attention convention, model, accelerator with its stated part,
    cap and network, device count, sequence and global batch."""
    return (*_stack(r), r.gpus, r.seq, r.global_batch)


def _grouped(runs: tuple[PublishedRun, ...], key: Callable[[PublishedRun], object]
             ) -> list[list[PublishedRun]]:
    """The checked runs (not excluded, not unverified) grouped by ``key``, in the table's
    order; groups of one dropped."""
    groups: dict[object, list[PublishedRun]] = {}
    for r in runs:
        if not r.excluded and r.role != "unverified":
            groups.setdefault(key(r), []).append(r)
    return [g for g in groups.values() if len(g) > 1]


def _next_along_each_line(a: PublishedRun, group: list[PublishedRun]
                          ) -> list[tuple[PublishedRun, PublishedRun]]:
    """``a`` with the next run of its series along each line: the fewest more devices at
    its global batch, the fewest more devices at its batch per device, the smallest larger
    global batch on its devices."""
    lines = (lambda b: b.global_batch == a.global_batch and b.gpus > a.gpus,
             lambda b: (b.global_batch * a.gpus == a.global_batch * b.gpus
                        and b.gpus > a.gpus),
             lambda b: b.gpus == a.gpus and b.global_batch > a.global_batch)
    out = []
    for on_line in lines:
        later = [b for b in group if on_line(b)]
        if later:
            out.append((a, min(later, key=lambda b: (b.gpus, b.global_batch))))
    return out


def pairs(runs: tuple[PublishedRun, ...] = RUNS) -> list[Pair]:
    """Every pair of runs of one :func:`job`, in the table's order, then each run of a
    :func:`series` with the next along each line (:func:`_next_along_each_line`); each
    priced."""
    todo = [p for g in _grouped(runs, job) for p in itertools.combinations(g, 2)]
    for group in _grouped(runs, series):
        todo += [p for a in group for p in _next_along_each_line(a, group) if p not in todo]
    seconds = {r.name: predict(r)["step_seconds"] for p in todo for r in p}
    out = []
    for a, b in todo:
        sa, sb = settings(a), settings(b)
        changes = {k: (sa.get(k, "-"), sb.get(k, "-")) for k in sorted(sa | sb)
                   if sa.get(k) != sb.get(k)}
        out.append(Pair(a, b, changes, kind_of(changes),
                        cost(b, b.measured_step) / cost(a, a.measured_step),
                        cost(b, seconds[b.name]) / cost(a, seconds[a.name])))
    return out


@dataclass(frozen=True)
class Summary:
    """Over some pairs: how many, the mean absolute ratio error, how many were scored (not
    close) and how many of those the planner ordered as measured."""

    count: int
    ratio_error: float
    scored: int
    agreed: int


def summary(ps: list[Pair]) -> Summary:
    """:class:`Summary` of ``ps``."""
    scored = [p for p in ps if not p.close]
    return Summary(len(ps), float(np.mean([abs(p.ratio_error) for p in ps])), len(scored),
                   sum(p.agrees for p in scored))


def _change_text(changes: dict[str, tuple[str, str]]) -> str:
    """What differs, shortly: stage splits named, not spelled out."""
    parts = []
    for k, (x, y) in changes.items():
        if k == "stage_layers":
            parts.append("uneven stages" if y != "-" else "even stages")
        else:
            parts.append(f"{k} {x} -> {y}")
    return ", ".join(parts)


def pairs_table(ps: list[Pair]) -> str:
    """The markdown of ``ps``: a row per pair."""
    lines = ["| kind | run a | run b | what b changes | measured b / a | predicted | "
             "ratio error | order |", "|---|---|---|---|---|---|---|---|"]
    for p in ps:
        order = "close" if p.close else ("agrees" if p.agrees else "**reversed**")
        lines.append(f"| {p.kind} | {p.a.name} | {p.b.name} | {_change_text(p.changes)} | "
                     f"{p.measured:.3f} | {p.predicted:.3f} | {p.ratio_error:+.1%} | {order} |")
    return "\n".join(lines)


def summary_lines(ps: list[Pair]) -> list[str]:
    """One line per kind, one for the choices together, then the scaling and batch pairs:
    the counts and the two figures."""
    lines = []
    for label in (*CHOICES, "all choices", "strong", "weak", "batch"):
        sel = ([p for p in ps if p.kind in CHOICES] if label == "all choices"
               else [p for p in ps if p.kind == label])
        if sel:
            s = summary(sel)
            lines.append(f"- {label}: {s.count} pairs, mean absolute ratio error "
                         f"{s.ratio_error:.1%}; ordered as measured {s.agreed} of {s.scored} "
                         f"(the other {s.count - s.scored} within {CLOSE:.0%})")
    return lines


def main() -> int:
    """Print the summary and the table of every pair."""
    ps = pairs()
    print("\n".join(summary_lines(ps)) + "\n\n" + pairs_table(ps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
