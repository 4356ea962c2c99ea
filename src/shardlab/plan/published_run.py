"""One published training run as the planner's validation set records it.

A run gives the model's shape, the layout, the devices, the facts of its cluster and
software that change its time (dtype, framework, overlap options, NICs, power cap) and
a measured time per step (or the achieved throughput from which the step time follows by
the source's own formula). Its ``role`` is ``calibration`` (an efficiency curve is
fitted on it), ``validation`` (held out: never used in a fit) or ``unverified`` (figures
that could not be checked: shown, never fitted or averaged). ``checked`` says what the
figures were checked against, ``assumed`` what the source does not state (decided before
any prediction was made), ``excluded`` why a held-out run is left out of the headline
mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shardlab.config.hardware import Accelerator, get_accelerator, power_capped, with_nics
from shardlab.config.model import ModelShape

ROLES: tuple[str, ...] = ("calibration", "validation", "unverified")


@dataclass(frozen=True)
class PublishedRun:
    """One published run: shape, layout, devices, measured seconds per step, and its role.

    ``options``: step-time ``--layout`` keys (``overlap_tp=1 fused_norm=0``) on top of
    ``framework``'s defaults (None: the planner's own). ``hardware``: fields of the
    catalog accelerator the run's devices differ in (torchtitan's 96 GB HBM2e H100s).
    ``nics_per_node``, ``nic_gbps``, ``power_cap_w``: the cluster facts of ``shardlab plan``.
    ``cp``, ``stage_layers``, ``dp_replicate``: context parallel, uneven pipeline stages and
    HSDP replicas, as the ``--layout`` keys of the same names.
    """

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
    role: str
    measured_from: str
    recompute: str = "full"
    sp: bool = False
    zero: int = 0
    micro_batch: int = 1
    virtual: int = 1
    flash: bool = False
    schedule: str | None = None
    dtype: str = "bf16"
    framework: str | None = "megatron"
    options: str = ""
    ep: int = 1
    etp: int | None = None
    capacity_factor: float = 0.0
    cp: int = 1
    stage_layers: tuple[int, ...] = ()
    dp_replicate: int = 1
    hardware: tuple[tuple[str, float], ...] = ()
    nics_per_node: int | None = None
    nic_gbps: float | None = None
    power_cap_w: float | None = None
    assumed: tuple[str, ...] = field(default=())
    checked: str = ""
    excluded: str = ""
    measured_memory_gib: float | None = None
    """The source's measured peak memory per GPU, GiB, or None (a run with no measured step,
    ``measured_step`` NaN, is a memory-only row: :mod:`shardlab.plan.runs_memory`)."""
    memory_figure: str = "reserved"
    """What the memory figure is: ``reserved`` (torchtitan prints the caching allocator's
    ``reserved_bytes.all.peak``) or ``allocated`` (Megatron-LM's ``mem-max-allocated-bytes``,
    ``allocated_bytes.all.peak``)."""

    @property
    def dp(self) -> int:
        """Data-parallel degree: gpus / (cp·tp·pp)."""
        return self.gpus // (self.cp * self.tp * self.pp)

    @property
    def layout_text(self) -> str:
        """The run's layout in ``shardlab plan --layout`` form (step-time keys included)."""
        sched = self.schedule or ("interleaved-1f1b" if self.virtual > 1 else "1f1b")
        moe = (f" ep={self.ep} etp={self.tp if self.etp is None else self.etp}"
               f" capacity_factor={self.capacity_factor:g}" if self.model.moe else "")
        new = (f" cp={self.cp}" if self.cp > 1 else "") + (
            " stage_layers=" + "+".join(map(str, self.stage_layers))
            if self.stage_layers else "") + (
            f" dp_replicate={self.dp_replicate}" if self.dp_replicate > 1 else "")
        return (f"dp={self.dp} tp={self.tp} pp={self.pp} virtual={self.virtual} "
                f"micro_batch={self.micro_batch} zero={self.zero} sp={int(self.sp)} "
                f"recompute={self.recompute} schedule={sched}{moe}{new} "
                f"{self.options}").strip()

    @property
    def short_layout(self) -> str:
        """The layout as the validation table shows it: tp8 pp16 dp64 v4 none sp zero1 (cp2
        after dp with context parallelism, hsdp16 with HSDP replicas, 1+2x62+1 with uneven
        stages)."""
        split = self.stage_layers
        uneven = (f" {split[0]}+{split[1]}x{len(split) - 2}+{split[-1]}"
                  if len(split) > 2 and len(set(split[1:-1])) == 1
                  else " " + "+".join(map(str, split)) if split else "")
        return (f"tp{self.tp} pp{self.pp} dp{self.dp}"
                + (f" cp{self.cp}" if self.cp > 1 else "")
                + (f" hsdp{self.dp_replicate}" if self.dp_replicate > 1 else "")
                + uneven
                + (f" ep{self.ep}" if self.ep > 1 else "")
                + (f" v{self.virtual}" if self.virtual > 1 else "")
                + f" {self.recompute}" + (" sp" if self.sp else "") + f" zero{self.zero}"
                + (" fp8" if self.dtype == "fp8" else "") + (f" {self.options}"
                                                            if self.options else ""))

    def accelerator(self) -> Accelerator:
        """The catalog accelerator with the run's hardware differences and cluster facts."""
        acc = get_accelerator(self.gpu)
        if self.hardware:
            acc = replace(acc, **dict(self.hardware))
        if self.nics_per_node is not None or self.nic_gbps is not None:
            acc = with_nics(acc, self.nics_per_node, self.nic_gbps)
        return acc if self.power_cap_w is None else power_capped(acc, self.power_cap_w)


def tokens_step(global_batch: int, seq: int, gpus: int, tokens_per_gpu: float) -> float:
    """Seconds per step from a throughput in tokens/s per GPU: B·s / (GPUs · tokens/s)."""
    return global_batch * seq / (gpus * tokens_per_gpu)


def bridge_fp8_recipe(name: str) -> str:
    """The ``fp8_recipe`` key of a Megatron-Bridge fp8 row: its tables' MXFP8 rows run MXFP8,
    their FP8 rows current (tensorwise) scaling (its perf scripts' ``fp8_cs``, the precision
    each such row's checked text quotes)."""
    return " fp8_recipe=" + ("mxfp8" if "MXFP8" in name else "tensorwise")


def megatron_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Megatron-LM's model FLOPs of one iteration for an MHA, 4h-GELU GPT
    (``num_floating_point_operations``): 72·B·s·L·h²·(1 + s/6h + V/12hL)."""
    b, s, L, h, V = batch, seq, layers, hidden, vocab
    return 72.0 * b * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
