"""Memory per device for a layout: weights, gradients, optimizer state, activations.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, Sec. 5.1) for Ψ
parameters on a model-parallel rank, data-parallel degree N_d and the dtype
policy's bytes w (weight), g (gradient), o (optimizer):

  stage 0: (w + g + o)·Ψ          stage 2: w·Ψ + (g + o)·Ψ/N_d
  stage 1: (w + g)·Ψ + o·Ψ/N_d    stage 3: (w + g + o)·Ψ/N_d

which for bf16 with fp32 master Adam (2 + 2 + 12) is the paper's 16Ψ, 4Ψ + 12Ψ/N_d,
2Ψ + 14Ψ/N_d and 16Ψ/N_d. Ψ is the parameter count on the most loaded
(tensor, pipeline) rank, see :mod:`shardlab.estimate.partition`.

Activations: :mod:`shardlab.estimate.activations` per layer, times the layer
micro-batches each pipeline rank holds at its peak. Rank r of p holds, in units
of its own layers' micro-batches (capped by the m micro-batches of the step):

* GPipe: m (all forwards before any backward);
* 1F1B: p - r (Narayanan et al. 2021);
* ZB-H1: p on every rank (rank r postpones its W by r steps and activations stay
  until W: the first stage's 1F1B peak, Qi et al. 2024);
* ZB-H2: 2p - 1 on every rank (Qi et al. 2024);
* interleaved 1F1B, v chunks: Megatron-LM's warm-up count 2(p - r - 1) + (v - 1)p + 1
  chunk micro-batches, which on the first stage is p·(1 + (p-1)/(p·v)) stage
  micro-batches (Korthikanti et al. 2022 Sec. 4.2.3);
* ZB-V: p on every rank (2p half-size chunk micro-batches; Qi et al. 2024 Sec. 6);
* DualPipeV: p + 1/2 on every rank (2p + 1 half-size chunk micro-batches).

Every count is the peak that :mod:`shardlab.schedules.simulate` measures on the
generated schedule (``tests/schedules`` checks that they agree).

Not modelled: allocator fragmentation, communication buffers, FSDP's transient
unsharded parameters, CUDA context and workspace (budget a few GB for them).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.activations import (
    first_stage_extra_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
)
from shardlab.estimate.partition import chunk_layers, stage_params


@dataclass(frozen=True)
class StateBytes:
    """Bytes of weights, gradients and optimizer state on one device."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        """Sum of the three."""
        return self.weights + self.gradients + self.optimizer


def zero_state_bytes(params: float, policy: DtypePolicy, zero: int, dp: int) -> StateBytes:
    """Model-state bytes per device under ZeRO ``zero`` over ``dp`` devices (module docstring)."""
    w = params * policy.weight_bytes
    g = params * policy.grad_bytes
    o = params * policy.optimizer_bytes
    return StateBytes(w / dp if zero >= 3 else w, g / dp if zero >= 2 else g,
                      o / dp if zero >= 1 else o)


def inflight_microbatches(schedule: str, pp: int, rank: int, microbatches: int,
                          virtual_stages: int = 1) -> float:
    """Peak micro-batches of its own layers that pipeline ``rank`` holds (module docstring).

    For interleaved 1F1B the count is in chunk micro-batches divided by v, so that
    it multiplies the rank's whole layer count like the others.
    """
    p, r, m, v = pp, rank, microbatches, virtual_stages
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(p - r, m))
    if schedule == "zb-h1":
        return float(min(p, m))
    if schedule == "zb-h2":
        return float(min(2 * p - 1, m))
    if schedule == "interleaved-1f1b":
        return min(2 * (p - r - 1) + (v - 1) * p + 1, m * v) / v
    if schedule == "zb-v":
        return float(min(p, m))
    if schedule == "dualpipev":
        return min(2 * p + 1, 2 * m) / 2
    raise ValueError(f"schedule={schedule!r}")


@dataclass(frozen=True)
class StageMemory:
    """Memory of one device of one pipeline stage, bytes."""

    stage: int
    params: int
    states: StateBytes
    activations: float
    inflight: float

    @property
    def total(self) -> float:
        """States plus activations."""
        return self.states.total + self.activations


def stage_memory(m: ModelShape, layout: Layout, dropout: bool,
                 flash: bool = False) -> list[StageMemory]:
    """Per pipeline stage: model states under ZeRO and peak activations."""
    lay = layout
    e = lay.dtype.activation_bytes
    kw = {"tp": lay.tp, "sp": lay.sp, "recompute": lay.recompute, "dropout": dropout,
          "flash": flash}
    per_layer = [layer_activation_bytes(m, lay.micro_batch, lay.seq, e,
                                        moe_layer=i >= m.dense_layers, **kw)
                 for i in range(m.layers)]
    # Sum the layers of each rank's chunks (chunk c on rank c mod pp).
    sizes = chunk_layers(m.layers, lay.pp, lay.virtual_stages)
    rank_act = [0.0] * lay.pp
    start = 0
    for c, n in enumerate(sizes):
        rank_act[c % lay.pp] += sum(per_layer[start:start + n])
        start += n
    params = stage_params(m, lay.tp, lay.pp, lay.virtual_stages)
    out = []
    for r in range(lay.pp):
        k = inflight_microbatches(lay.schedule, lay.pp, r, lay.microbatches, lay.virtual_stages)
        act = rank_act[r] * k
        if r == 0:
            act += k * first_stage_extra_bytes(m, lay.micro_batch, lay.seq, tp=lay.tp,
                                               sp=lay.sp, dropout=dropout)
        if r == lay.pp - 1:
            # Logits live only from the loss to their backward, except under GPipe.
            last_k = k if lay.schedule == "gpipe" else 1.0
            act += last_k * last_stage_extra_bytes(m, lay.micro_batch, lay.seq, e,
                                                   tp=lay.tp, sp=lay.sp)
        out.append(StageMemory(r, params[r], zero_state_bytes(params[r], lay.dtype, lay.zero,
                                                              lay.dp), act, k))
    return out


def peak_stage(stages: list[StageMemory]) -> StageMemory:
    """The stage with the largest total: the one that decides whether the layout fits."""
    return max(stages, key=lambda s: s.total)
