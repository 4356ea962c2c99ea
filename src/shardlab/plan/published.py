"""Published training runs with a measured step time, to calibrate and validate the planner.

Each run gives the model's shape, the layout, the devices and a measured time per
step, or the achieved TFLOP/s per GPU from which the step time follows by the paper's
own FLOP formula. Runs are ``calibration`` (the efficiency curves in
:mod:`shardlab.config.hardware` are fitted on them, :func:`fit`), ``validation``
(held out: never used in a fit) or ``unverified`` (figures that could not be checked
against a reachable source: shown in the table, never fitted or averaged). Each run's
``checked`` says what its figures were checked against; a held-out run that is left
out of the headline mean (:func:`held_out_mean`) says why in ``excluded``. What a
paper does not state is an assumption, listed in ``assumed``.

Sources:

* NAR21: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM" (SC21, arXiv 2104.04473), Table 1: GPT models, vocabulary
  51,200, sequence 2048, A100 80GB (Selene: 8 per node, 8 HDR 200G NICs per node),
  full activation recompute; TFLOP/s per GPU counted with 96·B·s·L·h²·(1 + s/6h +
  V/16Lh) (their Sec. 5.1, recompute included). Checked against a row-by-row
  transcription of Table 1 and the abstract (``_NAR21_CHECKED``).
* KOR22: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models" (arXiv 2205.05198), Tables 3 and 5: iteration times with full
  recompute and with selective recompute + sequence parallelism, data parallel 1. The
  selective column is checked against the Megatron-LM README's MFU table.
* MTNLG: Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG
  530B" (arXiv 2201.11990), Sec. 2.4: iteration times at 280, 350 and 420 DGX A100
  nodes, batch 1920, sequence 2048.
* LLAMA3: Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4:
  Llama 3.1 405B on H100, sequence 8192, 16M tokens per batch, TFLOP/s per GPU (checked
  against transcriptions of Table 4).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import Accelerator, Efficiency, get_accelerator
from shardlab.config.model import ModelShape
from shardlab.estimate.flops import flops_per_token, narayanan_full_recompute_flops
from shardlab.plan.search import layout_candidates, plan
from shardlab.plan.space import Space
from shardlab.plan.step_time import StepOptions


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelShape:
    return ModelShape(name, layers, hidden, heads, vocab=51200, context=2048, style="gpt",
                      tied=True)


@dataclass(frozen=True)
class PublishedRun:
    """One published run: shape, layout, devices, measured seconds per step, and its role."""

    name: str
    source: str
    model: ModelShape
    gpu: str
    gpus: int
    tp: int
    pp: int
    global_batch: int
    seq: int
    measured_step: float
    role: str  # "calibration", "validation" or "unverified" (shown, never fitted or averaged)
    measured_from: str
    recompute: str = "full"
    sp: bool = False
    zero: int = 0
    micro_batch: int = 1
    virtual: int = 1
    flash: bool = False
    overlap_dp: bool = False
    assumed: tuple[str, ...] = field(default=())
    checked: str = ""
    """What the figures were checked against (a source reached with the search tool), or
    why they could not be; a run with role "unverified" has none."""
    excluded: str = ""
    """Why a held-out run is left out of the headline mean (it stays in the table)."""

    @property
    def dp(self) -> int:
        """Data-parallel degree: gpus / (tp·pp)."""
        return self.gpus // (self.tp * self.pp)

    @property
    def layout_text(self) -> str:
        """The run's layout in ``shardlab plan --layout`` form."""
        sched = "interleaved-1f1b" if self.virtual > 1 else "1f1b"
        return (f"dp={self.dp} tp={self.tp} pp={self.pp} virtual={self.virtual} "
                f"micro_batch={self.micro_batch} zero={self.zero} sp={int(self.sp)} "
                f"recompute={self.recompute} schedule={sched}")


_MEGATRON_2021 = ("micro-batch 1", "non-interleaved 1F1B", "gradient all-reduce not overlapped "
                  "with backward (Megatron-LM 2021)")


_NAR21_CHECKED = (
    "Table 1 as transcribed row by row in SotaroKaneda/MLCarbon data/megatron_table.csv (heads, "
    "hidden, layers, tp, pp, GPUs, batch, TFLOP/s, % of peak, aggregate PFLOP/s; internally "
    "consistent); independently, the abstract gives 502 PFLOP/s on 3072 GPUs (52% of peak) for "
    "1T, and a summary of the paper 148 TFLOP/s / 47% / 227 PFLOP/s on 1536 GPUs and 44% at 32 "
    "GPUs; the README's text gives vocabulary 51,200 and sequence 2048. The table itself is an "
    "image in the Megatron-LM README and the paper's text was not reachable")


def _nar21(name: str, layers: int, hidden: int, heads: int, tp: int, pp: int, gpus: int,
           batch: int, tflops: float, role: str) -> PublishedRun:
    m = _gpt(name, layers, hidden, heads)
    step = narayanan_full_recompute_flops(batch, 2048, layers, hidden, 51200) / (gpus * tflops
                                                                                 * 1e12)
    return PublishedRun(f"NAR21 {name}", "Narayanan et al. 2021, Table 1", m, "A100 SXM 80GB",
                        gpus, tp, pp, batch, 2048, step, role,
                        f"{tflops:g} TFLOP/s per GPU (96BsLh² formula)",
                        assumed=_MEGATRON_2021, checked=_NAR21_CHECKED)


def _kor22(name: str, layers: int, hidden: int, heads: int, pp: int, gpus: int, batch: int,
           full_s: float, selective_s: float, readme_mfu: float,
           role: str) -> list[PublishedRun]:
    m = _gpt(name, layers, hidden, heads)
    common = {"model": m, "gpu": "A100 SXM 80GB", "gpus": gpus, "tp": 8, "pp": pp,
              "global_batch": batch, "seq": 2048,
              "source": "Korthikanti et al. 2022, Tables 3 and 5",
              "assumed": ("micro-batch 1", "non-interleaved 1F1B")}
    mfu = 72 * batch * layers * 2048 * hidden**2 * (1 + 2048 / (6 * hidden)
                                                    + 51200 / (12 * hidden * layers))
    mfu /= selective_s * gpus * 312e12
    return [PublishedRun(f"KOR22 {name} full", measured_step=full_s, recompute="full",
                         measured_from=f"iteration time {full_s} s", role="unverified",
                         checked="NOT checked: the full-recompute column of Table 5 was not "
                         "reachable (only the selective column's MFU is, in the Megatron-LM "
                         "README)", **common),
            PublishedRun(f"KOR22 {name} selective+SP", measured_step=selective_s,
                         recompute="selective", sp=True,
                         measured_from=f"iteration time {selective_s} s", role=role,
                         checked=f"the Megatron-LM README's MFU table (data parallel 1, "
                         f"72BLsh²(1 + s/6h + V/12hL) model FLOPs) gives {readme_mfu:.1%}; this "
                         f"row's shape, batch and time give {mfu:.1%}", **common)]


def _mtnlg(nodes: int, step: float) -> PublishedRun:
    return PublishedRun(f"MTNLG 530B {nodes} nodes", "Smith et al. 2022, Sec. 2.4",
                        _gpt("mt-nlg-530b", 105, 20480, 128), "A100 SXM 80GB", nodes * 8, 8, 35,
                        1920, 2048, step, "validation", f"iteration time {step} s",
                        assumed=_MEGATRON_2021,
                        checked="times 60.1/50.2/44.4 s and 126/121/113 TFLOP/s per GPU at "
                        "batch 1920 on 280/350/420 DGX A100 nodes, as quoted from Sec. 2.4 by "
                        "the llm-analysis project (cli99/llm-analysis, examples/megatron-turing-"
                        "nlg); the 96BsLh² formula turns each time into its TFLOP/s within 1%",
                        excluded="inconsistent with KOR22 530B on the same model, layout and "
                        "GPUs: 0.25 s per micro-batch against 0.175 s (a production run on "
                        "DeepSpeed's pipeline engine, not Megatron's benchmark)")


def _llama3(gpus: int, tflops: float, role: str) -> PublishedRun:
    m = get_model("llama-3.1-405b")
    tokens = 2048 * 8192
    step = flops_per_token(m, 8192).train * tokens / (gpus * tflops * 1e12)
    return PublishedRun(f"LLAMA3 405B {gpus} GPUs", "Dubey et al. 2024, Table 4", m,
                        "H100 SXM", gpus, 8, 16, 2048, 8192, step, role,
                        f"{tflops:g} TFLOP/s per GPU (shardlab's model FLOPs)",
                        recompute="none", sp=True, zero=1, virtual=4, flash=True,
                        overlap_dp=True,
                        assumed=("micro-batch 1", "interleaved 1F1B with 4 chunks per rank",
                                 "ZeRO-1", "no recompute", "sequence parallel",
                                 "Meta's FLOP count = shardlab's (full s x s attention)"),
                        checked="Table 4 (p. 10) as transcribed from the PDF in several public "
                        "copies of the paper: 8,192 GPUs TP 8, CP 1, PP 16, DP 64, sequence 8,192, "
                        "batch 32 per DP group, 16M tokens, 430 TFLOP/s, 43% BF16 MFU; 16,384 "
                        "GPUs DP 128, batch 16 per DP group, 400 TFLOP/s, 41%; Sec. 3.3.2 gives "
                        "the 38-43% MFU range. Table 4's DP is FSDP: which ZeRO stage it "
                        "matches is assumed")


RUNS: tuple[PublishedRun, ...] = (
    _nar21("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, "calibration"),
    _nar21("3.6B", 30, 3072, 32, 2, 1, 64, 512, 138, "validation"),
    _nar21("7.5B", 36, 4096, 32, 4, 1, 128, 512, 142, "calibration"),
    _nar21("18.4B", 40, 6144, 48, 8, 1, 256, 1024, 135, "validation"),
    _nar21("39.1B", 48, 8192, 64, 8, 2, 512, 1536, 138, "calibration"),
    _nar21("76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 140, "validation"),
    _nar21("145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 148, "calibration"),
    _nar21("310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 155, "validation"),
    _nar21("529.6B", 105, 20480, 128, 8, 35, 2520, 2520, 163, "calibration"),
    _nar21("1008.0B", 128, 25600, 160, 8, 64, 3072, 3072, 163, "validation"),
    *_kor22("22B", 48, 6144, 64, 1, 8, 4, 1.42, 1.10, 0.415, "calibration"),
    *_kor22("175B", 96, 12288, 96, 8, 64, 64, 18.13, 13.75, 0.514, "validation"),
    *_kor22("530B", 105, 20480, 128, 35, 280, 280, 49.05, 37.83, 0.560, "calibration"),
    *_kor22("1T", 128, 25600, 160, 64, 512, 512, 94.42, 71.49, 0.563, "validation"),
    _mtnlg(280, 60.1),
    _mtnlg(350, 50.2),
    _mtnlg(420, 44.4),
    _llama3(8192, 430, "calibration"),
    _llama3(16384, 400, "validation"),
)


def predict(run: PublishedRun, acc: Accelerator | None = None) -> dict[str, float]:
    """The planner's step seconds and MFU for ``run`` on ``acc`` (default: the catalog's)."""
    acc = acc or get_accelerator(run.gpu)
    space = Space(gpus=run.gpus, global_batch=run.global_batch, seq=run.seq)
    only = layout_candidates(run.model, space, run.layout_text)
    p = plan(run.model, acc, space, get_policy("bf16"), top=1, only=only,
             options=StepOptions(flash=run.flash, overlap_dp=run.overlap_dp),
             dropout=run.model.style == "gpt")
    best = p.best[0]
    return {"step_seconds": best["step_seconds"], "mfu": best["mfu"]}


def errors(runs: list[PublishedRun], acc: Accelerator | None = None) -> np.ndarray:
    """Relative step-time errors (predicted / measured - 1) of ``runs``."""
    return np.array([predict(r, acc)["step_seconds"] / r.measured_step - 1 for r in runs])


def fit(gpu: str, free: tuple[str, ...] = ("peak_fraction", "half_intensity"),
        base: Efficiency | None = None, rounds: int = 3) -> tuple[Efficiency, float]:
    """Fit ``free`` fields of ``gpu``'s efficiency curve to its calibration runs: the mean
    absolute step-time error minimised on a grid refined ``rounds`` times. Returns the
    curve and its mean absolute error on those runs."""
    acc = get_accelerator(gpu)
    runs = [r for r in RUNS if r.role == "calibration" and r.gpu == acc.name]
    eff = base or acc.efficiency
    assert eff is not None
    spans = {"peak_fraction": (0.3, 1.0), "half_intensity": (0.0, 512.0),
             "link_fraction": (0.3, 1.0)}
    names = tuple(spans)
    for _ in range(rounds):
        grids = [np.linspace(*spans[k], 9) if k in free else [getattr(eff, k)] for k in names]
        scored = []
        for values in itertools.product(*grids):
            e = replace(eff, **{k: float(x) for k, x in zip(names, values, strict=True)})
            err = float(np.mean(np.abs(errors(runs, replace(acc, efficiency=e)))))
            scored.append((err, e))
        err, eff = min(scored, key=lambda x: x[0])
        for k in free:
            lo, hi = spans[k]
            step = (hi - lo) / 8
            floor = 0.0 if k == "half_intensity" else 0.05
            spans[k] = (max(floor, getattr(eff, k) - step), getattr(eff, k) + step)
    return eff, err


def held_out_mean(runs: tuple[PublishedRun, ...] = RUNS) -> tuple[float, int]:
    """The headline figure: mean absolute step-time error of the held-out (``validation``)
    runs whose figures were checked, less those ``excluded`` with a reason; and their count."""
    held = [r for r in runs if r.role == "validation" and not r.excluded]
    return float(np.mean(np.abs(errors(held)))), len(held)


def table() -> str:
    """The markdown table of ``docs/validation.md``: every run, predicted beside measured,
    then the mean absolute errors (calibration; held out; held out with the excluded runs;
    the unverified rows, which no figure uses)."""
    lines = ["| run | role | GPUs | layout | measured s/step | predicted s/step | error | "
             "MFU measured | MFU predicted |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[float]] = {"calibration": [], "validation": [], "excluded": [],
                                      "unverified": []}
    for r in RUNS:
        p = predict(r)
        err = p["step_seconds"] / r.measured_step - 1
        groups["excluded" if r.excluded else r.role].append(abs(err))
        mfu_measured = p["mfu"] * p["step_seconds"] / r.measured_step
        lay = (f"tp{r.tp} pp{r.pp} dp{r.dp}" + (f" v{r.virtual}" if r.virtual > 1 else "")
               + f" {r.recompute}" + (" sp" if r.sp else "") + f" zero{r.zero}")
        role = r.role + (" (excluded)" if r.excluded else "")
        lines.append(f"| {r.name} | {role} | {r.gpus} {r.gpu} | {lay} | "
                     f"{r.measured_step:.2f} | {p['step_seconds']:.2f} | {err:+.1%} | "
                     f"{mfu_measured:.1%} | {p['mfu']:.1%} |")

    def mean(xs: list[float]) -> str:
        return f"{np.mean(xs):.1%} ({len(xs)} runs)" if xs else "none"

    cal, held, exc, unv = (groups[k] for k in ("calibration", "validation", "excluded",
                                               "unverified"))
    lines += ["", f"mean absolute error: calibration {mean(cal)}; **held out {mean(held)}**; "
              f"held out with the excluded runs {mean(held + exc)}; unverified rows (neither "
              f"fitted nor averaged) {mean(unv)}"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
