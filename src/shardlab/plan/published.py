"""Published training runs with a measured step time, to calibrate and validate the planner.

The runs (:class:`~shardlab.plan.published_run.PublishedRun`) live by origin:
:mod:`~shardlab.plan.runs_papers` (Narayanan 2021, Korthikanti 2022, MT-NLG, Llama 3,
MegaScale, BLOOM), :mod:`~shardlab.plan.runs_nvidia` (Megatron-LM, NeMo, Megatron-Bridge,
the MoE model zoo), :mod:`~shardlab.plan.runs_pytorch` (torchtitan, MosaicML, IBM
fms-fsdp, NeMo AutoModel), :mod:`~shardlab.plan.runs_blackwell` (Megatron-Bridge on B200 and
GB200), :mod:`~shardlab.plan.runs_dgxc` (NVIDIA's DGX Cloud benchmarks, bf16 and fp8 on
GB200 and H100) and
:mod:`~shardlab.plan.runs_functional` (Megatron-LM's own memory-and-speed tests). Context
parallel, HSDP and uneven-stage runs are among them
(issue 17: NeMo's Llama 3 8B and 70B with CP 2, Megatron-Bridge's 405B with CP 2 and
uneven stages, torchtitan's 8B FSDP x CP series, fms-fsdp's 7B HSDP, Llama 3 405B with
its first and last stage one layer fewer). Each is ``calibration`` (the efficiency curves of
:mod:`shardlab.config.hardware` are fitted on them, :func:`fit`), ``validation`` (held out:
never used in a fit) or ``unverified``. The A100 and H100 calibration runs were chosen
before any of the new runs was predicted: the paper runs the project always fitted on,
and for the H100 curve one run per software stack (Llama 3 8,192 GPUs; torchtitan 8B
FSDP8 compiled; Megatron-Core 16B; MosaicML MPT-7B on 128 GPUs), for its fp8 fraction one
fp8 run on a single node from each of two stacks (torchtitan 8B; NeMo Llama 2 7B). The
Blackwell curve has two, each chosen when its kind first arrived: Megatron-Bridge's Llama
3.1 405B FP8 on 256 GB200 for the fp8 fraction, and later its bf16 twin from NVIDIA's
dgxc-benchmarking for the bf16 share, picked after the bf16 GB200 rows had been priced
on the borrowed H100 share (docs/validation.md says so).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import replace
from typing import Any

import numpy as np

from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import Efficiency, get_accelerator
from shardlab.plan.accuracy import SLICES, Traits, uneven
from shardlab.plan.options import policy_for, step_options_for
from shardlab.plan.overlap import framework as overlap_framework
from shardlab.plan.published_run import PublishedRun
from shardlab.plan.runs_blackwell import BLACKWELL_RUNS
from shardlab.plan.runs_deepseek import DEEPSEEK_RUNS
from shardlab.plan.runs_dgxc import DGXC_RUNS
from shardlab.plan.runs_flash import FLASH_RUNS
from shardlab.plan.runs_functional import FUNCTIONAL_RUNS
from shardlab.plan.runs_nvidia import NVIDIA_RUNS
from shardlab.plan.runs_papers import PAPER_RUNS
from shardlab.plan.runs_pytorch import PYTORCH_RUNS
from shardlab.plan.runs_skills import SKILL_RUNS
from shardlab.plan.search import layout_candidates, layout_step_keys, plan
from shardlab.plan.space import Space

RUNS: tuple[PublishedRun, ...] = (PAPER_RUNS + NVIDIA_RUNS + PYTORCH_RUNS + FLASH_RUNS
                                  + BLACKWELL_RUNS + DGXC_RUNS + FUNCTIONAL_RUNS + DEEPSEEK_RUNS
                                  + SKILL_RUNS)


def priced(run: PublishedRun, eff: Efficiency | None = None) -> dict[str, Any]:
    """The planner's entry for ``run``'s layout on its accelerator, as ``shardlab plan
    --layout`` prices it (with ``eff`` in place of the catalog's efficiency curve, when
    given): step seconds, MFU, memory per device and their breakdowns."""
    acc = run.accelerator()
    if eff is not None:
        acc = replace(acc, efficiency=eff)
    space = Space(gpus=run.gpus, global_batch=run.global_batch, seq=run.seq,
                  gpus_per_node=acc.gpus_per_node,
                  expert_fold=overlap_framework(run.framework).expert_fold)
    only = layout_candidates(run.model, space, run.layout_text)
    keys = layout_step_keys(run.options)
    options = step_options_for(acc, flash=run.flash, framework=run.framework, overrides=keys,
                               model=run.model)
    policy = policy_for(get_policy(run.dtype), keys)
    p = plan(run.model, acc, space, policy, top=1, only=only, options=options,
             dropout=run.model.style == "gpt")
    return p.best[0]


def predict(run: PublishedRun, eff: Efficiency | None = None) -> dict[str, float]:
    """The planner's step seconds and MFU for ``run`` (:func:`priced`)."""
    best = priced(run, eff)
    return {"step_seconds": best["step_seconds"], "mfu": best["mfu"]}


def errors(runs: list[PublishedRun], eff: Efficiency | None = None) -> np.ndarray:
    """Relative step-time errors (predicted / measured - 1) of ``runs``."""
    return np.array([predict(r, eff)["step_seconds"] / r.measured_step - 1 for r in runs])


def curve_runs(gpu: str, role: str = "calibration") -> list[PublishedRun]:
    """The runs of ``role`` whose accelerator shares ``gpu``'s efficiency curve (the A100
    80 and 40 GB share one, the H100s and H200 another)."""
    curve = get_accelerator(gpu).efficiency
    return [r for r in RUNS if r.role == role and get_accelerator(r.gpu).efficiency is curve]


SPANS: dict[str, tuple[float, float]] = {
    "peak_fraction": (0.3, 1.0), "half_intensity": (0.0, 512.0), "link_fraction": (0.3, 1.0),
    "fp8_peak_fraction": (0.3, 1.0)}


def fit(gpu: str, free: tuple[str, ...] = ("peak_fraction", "half_intensity"),
        base: Efficiency | None = None, rounds: int = 3,
        runs: list[PublishedRun] | None = None) -> tuple[Efficiency, float]:
    """Fit ``free`` fields of ``gpu``'s efficiency curve to ``runs`` (default: its
    calibration runs; ``fp8_peak_fraction`` to their fp8 ones only, of which the catalog
    has none: :data:`shardlab.config.hardware.FP8_SHARE_SOURCE`): the mean absolute
    step-time error minimised on a grid refined ``rounds`` times. Returns the curve and
    its mean absolute error on those runs."""
    eff = base or get_accelerator(gpu).efficiency
    assert eff is not None
    runs = curve_runs(gpu) if runs is None else runs
    if free == ("fp8_peak_fraction",):
        runs = [r for r in runs if r.dtype == "fp8"]
    else:
        runs = [r for r in runs if r.dtype != "fp8"]
    if not runs:
        raise ValueError(f"no {'fp8 ' if 'fp8_peak_fraction' in free else ''}calibration run "
                         f"on {gpu}'s curve to fit {', '.join(free)} on")
    spans = dict(SPANS)
    names = tuple(spans)
    for _ in range(rounds):
        grids = [np.linspace(*spans[k], 9) if k in free else [getattr(eff, k)] for k in names]
        scored = []
        for values in itertools.product(*grids):
            e = replace(eff, **{k: float(x) for k, x in zip(names, values, strict=True)})
            scored.append((float(np.mean(np.abs(errors(runs, e)))), e))
        err, eff = min(scored, key=lambda x: x[0])
        for k in free:
            lo, hi = spans[k]
            step = (hi - lo) / 8
            floor = 0.0 if k == "half_intensity" else 0.05
            spans[k] = (max(floor, getattr(eff, k) - step), getattr(eff, k) + step)
    return eff, err


def held_out(runs: tuple[PublishedRun, ...] = RUNS) -> list[PublishedRun]:
    """The held-out runs of the headline: ``validation``, checked, not ``excluded``."""
    return [r for r in runs if r.role == "validation" and not r.excluded]


def held_out_errors(runs: tuple[PublishedRun, ...] = RUNS) -> np.ndarray:
    """Relative step-time errors of :func:`held_out`."""
    return errors(held_out(runs))


def held_out_mean(runs: tuple[PublishedRun, ...] = RUNS) -> tuple[float, int]:
    """The headline figure: mean absolute step-time error of :func:`held_out`, and their
    count."""
    errs = held_out_errors(runs)
    return float(np.mean(np.abs(errs))), len(errs)


def _device(r: PublishedRun) -> str:
    """The run's devices as the table names them (a stated cap or part shown)."""
    extra = [f"{v / 1e9:.0f} GB" for k, v in r.hardware if k == "memory_bytes"]
    extra += [f"{r.power_cap_w:g} W"] if r.power_cap_w else []
    return f"{r.gpus} {r.gpu}" + (f" ({', '.join(extra)})" if extra else "")


def run_traits(r: PublishedRun) -> Traits:
    """What places ``r`` in the held-out slices (:data:`shardlab.plan.accuracy.SLICES`)."""
    moe = r.model.moe
    return Traits(r.gpu, get_policy(r.dtype).linear_compute, r.framework,
                  moe is not None, r.gpus, r.pp, r.cp, r.dp_replicate,
                  uneven(r.stage_layers), moe.experts / r.ep if moe else 0.0,
                  r.model.mla is not None)


def slice_figures(held: list[tuple[PublishedRun, float]]
                  ) -> dict[str, tuple[int, float, float, float]]:
    """Per slice of :data:`~shardlab.plan.accuracy.SLICES` holding any of ``held`` (runs
    with their errors): the count, the mean absolute error, the mean signed error and the
    worst absolute one, rounded to 0.1% (what :data:`~shardlab.plan.accuracy.HELD_OUT`
    stores)."""
    out = {}
    traits = [(run_traits(r), e) for r, e in held]
    for label, take in SLICES.items():
        errs = np.array([e for t, e in traits if take(t)])
        if len(errs):
            # + 0.0: a mean that rounds to -0.0 is stored and printed as 0.0.
            out[label] = (len(errs), *(round(float(x), 3) + 0.0 for x in (
                np.mean(np.abs(errs)), np.mean(errs), np.max(np.abs(errs)))))
    return out


def slices_table(figures: dict[str, tuple[int, float, float, float]]) -> str:
    """The markdown of the held-out slices (:func:`slice_figures`)."""
    lines = ["| held-out slice | runs | mean absolute error | mean error (signed) | worst |",
             "|---|---|---|---|---|"]
    lines += [f"| {label} | {n} | {mean_abs:.1%} | {mean:+.1%} | {worst:.1%} |"
              for label, (n, mean_abs, mean, worst) in figures.items()]
    return "\n".join(lines)


def table() -> str:
    """The markdown of ``docs/validation.md``: every run, predicted beside measured, then
    the mean absolute errors (calibration; held out, with its worst; held out with the
    excluded runs; the unverified rows, which no figure uses) and the held-out runs by
    slice (:func:`slices_table`): their mean absolute error, their mean signed error (below
    zero: the planner predicts that slice faster than it ran, on average) and the worst."""
    lines = ["| run | role | GPUs | layout | measured s/step | predicted s/step | error | "
             "MFU measured | MFU predicted |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[float]] = {"calibration": [], "validation": [], "excluded": [],
                                      "unverified": []}
    held: list[tuple[PublishedRun, float]] = []
    for r in RUNS:
        p = predict(r)
        err = p["step_seconds"] / r.measured_step - 1
        groups["excluded" if r.excluded else r.role].append(abs(err))
        if r.role == "validation" and not r.excluded:
            held.append((r, err))
        mfu_measured = p["mfu"] * p["step_seconds"] / r.measured_step
        role = r.role + (" (excluded)" if r.excluded else "")
        lines.append(f"| {r.name} | {role} | {_device(r)} | {r.short_layout} | "
                     f"{r.measured_step:.2f} | {p['step_seconds']:.2f} | {err:+.1%} | "
                     f"{mfu_measured:.1%} | {p['mfu']:.1%} |")

    def mean(xs: list[float]) -> str:
        return f"{np.mean(xs):.1%} ({len(xs)} runs)" if xs else "none"

    cal, val, exc, unv = (groups[k] for k in ("calibration", "validation", "excluded",
                                              "unverified"))
    worst = max(held, key=lambda x: abs(x[1]))
    lines += ["", f"mean absolute error: calibration {mean(cal)}; **held out {mean(val)}**, "
              f"worst {abs(worst[1]):.1%} ({worst[0].name}); held out with the excluded runs "
              f"{mean(val + exc)}; unverified rows (neither fitted nor averaged) {mean(unv)}",
              "", slices_table(slice_figures(held))]
    return "\n".join(lines)


def explain(run: PublishedRun) -> str:
    """One run taken apart (``python -m shardlab.plan.published --run NAME``): its facts,
    the layout and options priced, predicted beside measured, where the predicted step
    goes (exposed and hidden seconds) and the memory per device by category."""
    best = priced(run)
    err = best["step_seconds"] / run.measured_step - 1
    parts = ", ".join(f"{k} {v:.3f}" for k, v in best["breakdown"].items() if v)
    hidden = ", ".join(f"{k} {v:.3f}" for k, v in best["hidden"].items() if v) or "none"
    memory = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in best["memory_breakdown"].items()
                       if k != "stage" and v)
    lines = [f"{run.name} ({run.role}{', excluded' if run.excluded else ''}): {run.source}",
             f"  {run.gpus} x {run.gpu}, {run.framework or 'no framework named'}, "
             f"--layout \"{run.layout_text}\"",
             f"  measured {run.measured_step:.3f} s ({run.measured_from}); predicted "
             f"{best['step_seconds']:.3f} s, {err:+.1%}; MFU predicted {best['mfu']:.1%}",
             f"  step (s): {parts}", f"  hidden (s): {hidden}",
             f"  memory per device (GiB): {memory}",
             *(f"  assumed: {a}" for a in run.assumed), f"  checked: {run.checked}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The validation table, or with ``--run TEXT`` every run whose name contains TEXT
    taken apart (:func:`explain`); exit 2 with one line when none does."""
    ap = argparse.ArgumentParser(prog="python -m shardlab.plan.published",
                                 description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--run", help="explain the runs whose name contains this text")
    args = ap.parse_args(argv)
    if args.run is None:
        print(table())
        return 0
    found = [r for r in RUNS if args.run.lower() in r.name.lower()]
    if not found:
        print(f"{ap.prog}: error: run={args.run!r}: no run's name contains it (e.g. "
              f"{RUNS[0].name!r})", file=sys.stderr)
        return 2
    print("\n\n".join(explain(r) for r in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
