"""The planner's memory per device against published measured peaks.

Runs of :mod:`shardlab.plan.published` whose source states a measured peak memory per GPU
(:attr:`~shardlab.plan.published_run.PublishedRun.measured_memory_gib`) are priced with
the planner exactly as ``shardlab plan --layout ... --framework ...`` prices them: states,
saved activations and, with the run's framework, what that framework holds at its peak
(:mod:`shardlab.plan.memory_peak`). No constant of the memory model is fitted: every
term is a byte count with its source, so every row is held out. A measured reserved peak
also holds the caching allocator's unused blocks, so it sits a little above any allocated
peak; the table says which figure the source prints.
"""

from __future__ import annotations

import numpy as np

from shardlab.plan.published import RUNS, priced
from shardlab.plan.published_run import PublishedRun
from shardlab.plan.runs_memory import MEMORY_ONLY_RUNS

GIB = 2.0**30


def predict_memory(run: PublishedRun) -> dict[str, float]:
    """The planner's memory per device for ``run`` (bytes) with its breakdown."""
    best = priced(run)
    return {"memory_per_device": best["memory_per_device"], **best["memory_breakdown"]}


def memory_runs() -> list[PublishedRun]:
    """The runs that state a measured peak memory per GPU (the step-time runs that do, then
    the memory-only ones)."""
    return [r for r in RUNS if r.measured_memory_gib is not None] + list(MEMORY_ONLY_RUNS)


def memory_errors(runs: list[PublishedRun] | None = None) -> np.ndarray:
    """Relative memory errors (predicted / measured - 1) of ``runs`` (default: all that
    state one)."""
    runs = memory_runs() if runs is None else runs
    return np.array([predict_memory(r)["memory_per_device"] / GIB / r.measured_memory_gib - 1
                     for r in runs])


def memory_table() -> str:
    """The markdown of docs/validation.md's memory section: per run the measured and
    predicted GiB with the predicted parts, the error, then the mean and the worst."""
    lines = ["| run | GPUs | layout | measured GiB | figure | predicted GiB | states | saved "
             "activations | transient | error |", "|---|---|---|---|---|---|---|---|---|---|"]
    errs = []
    for r in memory_runs():
        p = predict_memory(r)
        assert r.measured_memory_gib is not None
        err = p["memory_per_device"] / GIB / r.measured_memory_gib - 1
        errs.append((r, err))
        states = (p["weights"] + p["gradients"] + p["optimizer"]) / GIB
        lines.append(f"| {r.name} | {r.gpus} {r.gpu} | {r.short_layout} | "
                     f"{r.measured_memory_gib:.1f} | {r.memory_figure} | "
                     f"{p['memory_per_device'] / GIB:.1f} | "
                     f"{states:.1f} | {p['activations'] / GIB:.1f} | "
                     f"{p['transient'] / GIB:.1f} | {err:+.1%} |")
    worst = max(errs, key=lambda x: abs(x[1]))
    mean = float(np.mean([abs(e) for _, e in errs]))
    lines += ["", f"memory per device: mean absolute error **{mean:.1%}** over {len(errs)} "
              f"runs, worst {abs(worst[1]):.1%} ({worst[0].name})"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(memory_table())
