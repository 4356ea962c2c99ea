"""Memory per device of many layouts at once: :func:`shardlab.estimate.memory.stage_memory`
over numpy arrays.

The formulas are the estimate's, not new ones: ZeRO model states (Rajbhandari et al.
2020) of the parameters on each (tensor, pipeline) rank
(:func:`shardlab.estimate.partition.stage_params`), and the activations of each rank's
layers (:func:`shardlab.estimate.activations.layer_activation_bytes`, Korthikanti et
al. 2022) times the micro-batches its schedule keeps in flight
(:func:`shardlab.estimate.memory.inflight_microbatches`), plus the first stage's
embedding mask and the last stage's logits. The per-shape pieces are computed once per
distinct (tp, pp, v) or (micro-batch, tp, sp, recompute) with the estimate's own
functions; only the products and the maximum over ranks are vectorised.
``tests/plan/test_memory.py`` holds every layout of a search equal to ``stage_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import RECOMPUTE, SCHEDULES
from shardlab.config.model import ModelShape
from shardlab.estimate.activations import (
    first_stage_extra_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
)
from shardlab.estimate.partition import chunk_layers, stage_params
from shardlab.plan.space import Candidates


@dataclass(frozen=True)
class MemoryOptions:
    """Activation conventions: dropout masks kept, fused (flash) attention."""

    dropout: bool
    flash: bool


@dataclass
class MemoryArrays:
    """Bytes on the busiest device of each layout, by kind, and that device's pipeline rank."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    params: np.ndarray
    stage: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """Weights + gradients + optimizer state + activations."""
        return self.weights + self.gradients + self.optimizer + self.activations


def _rank_tables(model: ModelShape, c: Candidates, width: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layout and pipeline rank (padded to ``width``): parameters, dense and MoE layers."""
    keys = np.stack([c.tp, c.pp, c.virtual], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    params = np.zeros((len(uniq), width))
    dense = np.zeros((len(uniq), width))
    moe = np.zeros((len(uniq), width))
    for i, (tp, pp, v) in enumerate(uniq.tolist()):
        params[i, :pp] = stage_params(model, tp, pp, v)
        layer = 0
        for ch, n in enumerate(chunk_layers(model.layers, pp, v)):
            # Dense layers come first, as in stage_params.
            d = max(0, min(n, model.dense_layers - layer))
            dense[i, ch % pp] += d
            moe[i, ch % pp] += n - d
            layer += n
    inv = inv.ravel()
    return params[inv], dense[inv], moe[inv]


def _activation_tables(model: ModelShape, c: Candidates, seq: int, elem: int,
                       opt: MemoryOptions) -> tuple[np.ndarray, ...]:
    """Per layout: one dense and one MoE layer's bytes per micro-batch, first and last extras."""
    keys = np.stack([c.micro_batch, c.tp, c.sp.astype(np.int64), c.recompute], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    rows = []
    for mb, tp, sp, rc in uniq.tolist():
        kw = {"tp": tp, "sp": bool(sp), "recompute": RECOMPUTE[rc], "dropout": opt.dropout,
              "flash": opt.flash}
        rows.append((
            layer_activation_bytes(model, mb, seq, elem, moe_layer=False, **kw),
            layer_activation_bytes(model, mb, seq, elem, moe_layer=True, **kw),
            first_stage_extra_bytes(model, mb, seq, tp=tp, sp=bool(sp), dropout=opt.dropout),
            last_stage_extra_bytes(model, mb, seq, elem, tp=tp, sp=bool(sp))))
    table = np.array(rows)[inv.ravel()]
    return table[:, 0], table[:, 1], table[:, 2], table[:, 3]


def inflight(schedule: np.ndarray, pp: np.ndarray, rank: np.ndarray, m: np.ndarray,
             v: np.ndarray) -> np.ndarray:
    """:func:`shardlab.estimate.memory.inflight_microbatches` over arrays (same cases)."""
    p, r, m, v = (np.asarray(x, float) for x in (pp, rank, m, v))
    s = np.asarray(schedule)
    shape = np.broadcast_shapes(p.shape, r.shape, m.shape, v.shape, s.shape)
    cases = {
        "gpipe": m,
        "1f1b": np.minimum(p - r, m),
        "zb-h1": np.minimum(p, m),
        "zb-h2": np.minimum(2 * p - 1, m),
        "interleaved-1f1b": np.minimum(2 * (p - r - 1) + (v - 1) * p + 1, m * v) / v,
        "zb-v": np.minimum(p, m),
        "dualpipev": np.minimum(2 * p + 1, 2 * m) / 2,
    }
    conds = [np.broadcast_to(s == SCHEDULES.index(k), shape) for k in cases]
    return np.select(conds, [np.broadcast_to(x, shape) for x in cases.values()])


def memory_arrays(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                  opt: MemoryOptions) -> MemoryArrays:
    """Bytes on the busiest device of every layout in ``c`` (module docstring)."""
    width = int(c.pp.max())
    params, dense, moe = _rank_tables(model, c, width)
    a_dense, a_moe, first, last = _activation_tables(model, c, seq, policy.activation_bytes,
                                                     opt)
    col = lambda x: np.asarray(x)[:, None]  # noqa: E731 - one layout per row
    rank = np.arange(width)[None, :]
    valid = rank < col(c.pp)
    k = inflight(col(c.schedule), col(c.pp), rank, col(c.microbatches), col(c.virtual))
    act = (dense * col(a_dense) + moe * col(a_moe)) * k
    act = act + np.where(rank == 0, k * col(first), 0.0)
    last_k = np.where(col(c.schedule) == SCHEDULES.index("gpipe"), k, 1.0)
    act = act + np.where(rank == col(c.pp) - 1, last_k * col(last), 0.0)
    dp = col(c.dp).astype(float)
    z = col(c.zero)
    w = params * policy.weight_bytes / np.where(z >= 3, dp, 1.0)
    g = params * policy.grad_bytes / np.where(z >= 2, dp, 1.0)
    o = params * policy.optimizer_bytes / np.where(z >= 1, dp, 1.0)
    total = np.where(valid, w + g + o + act, -np.inf)
    peak = np.argmax(total, axis=1)
    rows = np.arange(len(c))
    return MemoryArrays(w[rows, peak], g[rows, peak], o[rows, peak], act[rows, peak],
                        params[rows, peak], peak)
