"""Memory per device of many layouts at once: :func:`shardlab.estimate.memory.stage_memory`
over numpy arrays.

The formulas are the estimate's, not new ones: ZeRO model states (Rajbhandari et al.
2020) of the parameters on each (tensor, pipeline) rank
(:func:`shardlab.estimate.partition.stage_params`; routed experts split over ep and etp
and sharded over expert_dp = dp/ep, :func:`shardlab.estimate.expert.rank_params_split`),
the fp8 policy's copies and scales of the linear weights under ZeRO 0-2
(:func:`shardlab.estimate.fp8.layer_state_bytes`), and the activations of each rank's
layers (:func:`shardlab.estimate.activations.layer_activation_bytes`, Korthikanti et
al. 2022) times the micro-batches its schedule keeps in flight
(:func:`shardlab.estimate.memory.inflight_microbatches`), plus the first stage's
embedding mask and the last stage's logits. The per-shape pieces are computed once per
distinct (tp, pp, v, ep, etp) or (micro-batch, tp, sp, recompute, ep, etp, capacity
factor) with the estimate's own
functions; only the products and the maximum over ranks are vectorised.
``tests/plan/test_memory.py`` holds every layout of a search equal to ``stage_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import RECOMPUTE, SCHEDULES
from shardlab.config.model import ModelShape
from shardlab.estimate import fp8
from shardlab.estimate.activations import (
    first_stage_extra_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
)
from shardlab.estimate.partition import chunk_layers, stage_expert_params, stage_params
from shardlab.plan.space import Candidates, unique_rows


@dataclass(frozen=True)
class MemoryOptions:
    """Activation conventions: dropout masks kept, fused (flash) attention, the router's
    imbalance (max/mean tokens per expert; 1: balanced)."""

    dropout: bool
    flash: bool
    imbalance: float = 1.0


@dataclass
class MemoryArrays:
    """Bytes on the busiest device of each layout, by kind, and that device's pipeline rank;
    ``expert_params``: the routed-expert part of ``params`` (sharded over expert_dp)."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    params: np.ndarray
    stage: np.ndarray
    expert_params: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """Weights + gradients + optimizer state + activations."""
        return self.weights + self.gradients + self.optimizer + self.activations


def _rank_tables(model: ModelShape, c: Candidates, all_ranks: bool
                 ) -> tuple[np.ndarray, ...]:
    """Per layout, at each pipeline rank compared (every one, or 0, 1 and pp - 1 when
    ``all_ranks`` is false: :func:`_uniform`): the rank,
    its parameters, routed-expert parameters, dense layers and MoE layers (layouts x
    ranks compared; past a layout's pp the rank is padding and reads 0). Tables are built
    per distinct (tp, pp, v, ep, etp) and only at the ranks compared, so they stay as
    small as the block."""
    uniq, inv = unique_rows(c.tp, c.pp, c.virtual, c.ep, c.etp)
    width = int(uniq[:, 1].max(initial=1)) if all_ranks else 3
    ranks = np.zeros((len(uniq), width), dtype=np.int64)
    params = np.zeros((len(uniq), width))
    experts = np.zeros((len(uniq), width))
    dense = np.zeros((len(uniq), width))
    moe = np.zeros((len(uniq), width))
    dense_layers = model.dense_layers
    for i, (tp, pp, v, ep, etp) in enumerate(uniq.tolist()):
        ranks[i] = np.arange(width) if all_ranks else (0, min(1, pp - 1), pp - 1)
        at = np.minimum(ranks[i], pp - 1)
        real = ranks[i] < pp
        sizes = np.array(chunk_layers(model.layers, pp, v), dtype=np.int64)
        # Dense layers come first, as in stage_params; chunk c lives on rank c mod pp.
        d = np.clip(dense_layers - (np.cumsum(sizes) - sizes), 0, sizes)
        on = np.arange(len(sizes)) % pp
        total = np.array(stage_params(model, tp, pp, v, ep=ep, etp=etp), float)
        params[i] = np.where(real, total[at], 0.0)
        routed = np.array(stage_expert_params(model, pp, v, ep, etp), float)
        experts[i] = np.where(real, routed[at], 0.0)
        dense[i] = np.where(real, np.bincount(on, weights=d, minlength=pp)[at], 0.0)
        moe[i] = np.where(real, np.bincount(on, weights=sizes - d, minlength=pp)[at], 0.0)
    return ranks[inv], params[inv], experts[inv], dense[inv], moe[inv]


def _activation_tables(model: ModelShape, c: Candidates, seq: int, elem: int,
                       opt: MemoryOptions) -> tuple[np.ndarray, ...]:
    """Per layout: one dense and one MoE layer's bytes per micro-batch, first and last extras."""
    factors, cf_i = np.unique(c.capacity_factor, return_inverse=True)
    uniq, inv = unique_rows(c.micro_batch, c.tp, c.sp, c.recompute, c.ep, c.etp, cf_i.ravel())
    rows = []
    for mb, tp, sp, rc, ep, etp, cf in uniq.tolist():
        kw = {"tp": tp, "sp": bool(sp), "recompute": RECOMPUTE[rc], "dropout": opt.dropout,
              "flash": opt.flash, "ep": ep, "etp": etp,
              "capacity_factor": float(factors[cf]), "imbalance": opt.imbalance}
        rows.append((
            layer_activation_bytes(model, mb, seq, elem, moe_layer=False, **kw),
            layer_activation_bytes(model, mb, seq, elem, moe_layer=True, **kw),
            first_stage_extra_bytes(model, mb, seq, tp=tp, sp=bool(sp), dropout=opt.dropout),
            last_stage_extra_bytes(model, mb, seq, elem, tp=tp, sp=bool(sp))))
    table = np.array(rows)[inv.ravel()]
    return table[:, 0], table[:, 1], table[:, 2], table[:, 3]


def _fp8_tables(model: ModelShape, c: Candidates, policy: DtypePolicy
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per layout: fp8 copy and scale bytes of one dense and one MoE layer on a rank
    (:func:`shardlab.estimate.fp8.layer_state_bytes`), per distinct (tp, ep, etp)."""
    uniq, inv = unique_rows(c.tp, c.ep, c.etp)
    table = np.array([(fp8.layer_state_bytes(model, policy, tp, False),
                       fp8.layer_state_bytes(model, policy, tp, True, ep, etp))
                      for tp, ep, etp in uniq.tolist()]).reshape(-1, 2)[inv]
    return table[:, 0], table[:, 1]


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


BLOCK_ELEMENTS = 2**21
"""Layouts x pipeline ranks that :func:`memory_arrays` holds at once (about 17 MB per
float64 table, a dozen tables): a search of many deep layouts goes through in blocks of
layouts rather than building tables of every layout x every rank."""


def _uniform(model: ModelShape) -> bool:
    """Whether every layer is alike (all dense, or all MoE). Then only pipeline ranks 0, 1
    and pp - 1 need comparing: a middle rank holds only its layers, each with the same
    parameters and activations, and both its layer count (the first chunks are the larger
    ones) and the micro-batches it keeps in flight (:func:`inflight`: constant or falling
    with the rank, for every schedule) never grow with the rank, so rank 1 is the fullest
    middle rank; rank 0 adds the embedding and the last rank the head."""
    return model.dense_layers in (0, model.layers)


def memory_arrays(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                  opt: MemoryOptions, all_ranks: bool | None = None) -> MemoryArrays:
    """Bytes on the busiest device of every layout in ``c`` (module docstring).

    Ranks compared: every one, or when all layers are alike only ranks 0, 1 and pp - 1
    (:func:`_uniform`; ``all_ranks`` forces either way, for the tests). Computed in
    blocks of at most :data:`BLOCK_ELEMENTS` layouts x ranks compared.
    """
    all_ranks = not _uniform(model) if all_ranks is None else all_ranks

    def width(pp: int) -> int:
        """Ranks compared for a layout of ``pp`` stages."""
        return pp if all_ranks else 3

    if len(c) * width(int(c.pp.max(initial=1))) <= BLOCK_ELEMENTS:
        return _memory_block(model, c, seq, policy, opt, all_ranks)
    # Shallow layouts first, so each block's tables are as wide as its own deepest pipeline.
    order = np.argsort(c.pp, kind="stable")
    depth = c.pp[order]
    keys = ("weights", "gradients", "optimizer", "activations", "params", "stage",
            "expert_params")
    out = {k: np.zeros(len(c), dtype=np.int64 if k == "stage" else float) for k in keys}
    start = 0
    while start < len(c):
        # Rows for the block's first depth, then for the deepest depth among those rows:
        # no deeper than that, so they fit.
        first = min(len(c), start + BLOCK_ELEMENTS // width(int(depth[start])))
        deepest = width(int(depth[max(first, start + 1) - 1]))
        stop = min(len(c), start + max(1, BLOCK_ELEMENTS // deepest))
        idx = order[start:stop]
        part = _memory_block(model, c.take(idx), seq, policy, opt, all_ranks)
        for k in keys:
            out[k][idx] = getattr(part, k)
        start = stop
    return MemoryArrays(*(out[k] for k in keys))


def _memory_block(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                  opt: MemoryOptions, all_ranks: bool) -> MemoryArrays:
    """:func:`memory_arrays` of one block."""
    rank, params, experts, dense, moe = _rank_tables(model, c, all_ranks)
    a_dense, a_moe, first, last = _activation_tables(model, c, seq, policy.activation_bytes,
                                                     opt)
    col = lambda x: np.asarray(x)[:, None]  # noqa: E731 - one layout per row
    valid = rank < col(c.pp)
    k = inflight(col(c.schedule), col(c.pp), rank, col(c.microbatches), col(c.virtual))
    act = (dense * col(a_dense) + moe * col(a_moe)) * k
    act = act + np.where(rank == 0, k * col(first), 0.0)
    last_k = np.where(col(c.schedule) == SCHEDULES.index("gpipe"), k, 1.0)
    act = act + np.where(rank == col(c.pp) - 1, last_k * col(last), 0.0)
    dp = col(c.dp).astype(float)
    edp = col(c.dp // c.ep).astype(float)
    z = col(c.zero)
    dense_params = params - experts

    def sharded(nbytes: int, stage: int) -> np.ndarray:
        """Bytes of a state kind: the dense part sharded over dp, the experts over dp/ep,
        from ZeRO ``stage`` up (the :mod:`shardlab.estimate.states` formulas)."""
        on = z >= stage
        return nbytes * (dense_params / np.where(on, dp, 1.0) + experts / np.where(on, edp, 1.0))

    w = sharded(policy.weight_bytes, 3)
    if policy.is_fp8:
        # fp8 copies and scales of the rank's linear weights, held whole under ZeRO 0-2.
        f_dense, f_moe = _fp8_tables(model, c, policy)
        w = w + np.where(z < 3, dense * col(f_dense) + moe * col(f_moe), 0.0)
    g = sharded(policy.grad_bytes, 2)
    o = sharded(policy.optimizer_bytes, 1)
    total = np.where(valid, w + g + o + act, -np.inf)
    peak = np.argmax(total, axis=1)
    rows = np.arange(len(c))
    return MemoryArrays(w[rows, peak], g[rows, peak], o[rows, peak], act[rows, peak],
                        params[rows, peak], rank[rows, peak], experts[rows, peak])
