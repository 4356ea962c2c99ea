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
embedding mask and the last stage's logits (on the head's rank: rank 0 in a V). Context
parallel: the activations of a rank's s/cp tokens with the gathered K/V
(:func:`shardlab.estimate.memory.layer_bytes`), states sharded over dp_shard x cp, HSDP's
replicas keeping whole shards (:func:`shardlab.estimate.states.zero_groups`); uneven
stages place the layers of each split. The per-shape pieces are computed once per
distinct (tp, pp, v, ep, etp, split, V placement) or (micro-batch, tp, sp, recompute,
ep, etp, capacity factor, cp) with the estimate's own functions; only the products and
the maximum over ranks are vectorised. ``tests/plan/test_memory.py`` holds every layout
of a search equal to ``stage_memory``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import RECOMPUTE, SCHEDULES
from shardlab.config.model import ModelShape
from shardlab.estimate import fp8
from shardlab.estimate.activations import first_stage_extra_bytes, last_stage_extra_bytes
from shardlab.estimate.partition import chunk_layers, stage_expert_params, stage_params
from shardlab.plan.memory_peak import (
    MemoryFacts,
    rank_layout,
    saved_layer_bytes,
    transient_bytes,
)
from shardlab.plan.space import Candidates, unique_rows
from shardlab.plan.stages import V_INDEX, rank_placement
from shardlab.plan.step_inputs import StepOptions


@dataclass(frozen=True)
class MemoryOptions:
    """Activation conventions: dropout masks kept, fused (flash) attention, the router's
    imbalance (max/mean tokens per expert; 1: balanced), what selective recompute keeps
    (``attention``: Korthikanti's; ``op``: per-operator checkpointing,
    :func:`shardlab.estimate.activations.op_checkpoint_layer_bytes`) and a framework's
    memory facts (:class:`~shardlab.plan.memory_peak.MemoryFacts`; None: states and saved
    activations only, as :func:`shardlab.estimate.memory.stage_memory` counts them)."""

    dropout: bool
    flash: bool
    imbalance: float = 1.0
    selective: str = "attention"
    facts: MemoryFacts | None = None
    fp8_params: bool = False
    """fp8 primary weights (:attr:`shardlab.plan.step_inputs.StepOptions.fp8_params`)."""
    offload_layers: int = 0
    """Layers per rank whose activations live in host memory (:mod:`shardlab.plan.offload`)."""
    recompute_modules: tuple[str, ...] = ()
    """Megatron's ``--recompute-modules`` under selective recompute
    (:data:`shardlab.estimate.activations.RECOMPUTE_MODULES`); (): the attention core."""


def memory_options(options: StepOptions, *, dropout: bool, imbalance: float = 1.0
                   ) -> MemoryOptions:
    """The memory conventions a step-time model's ``options`` imply (its attention kernel,
    selective convention, framework facts, fp8 weights, offloaded layers and recompute
    modules): the one view ``plan``, its fit advice and ``budget --framework`` share."""
    return MemoryOptions(dropout, options.flash, imbalance, options.selective,
                         options.memory, options.fp8_params, options.offload_layers,
                         options.recompute_modules)


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
    transient: np.ndarray
    """What the framework holds at its peak beyond states and saved activations
    (:mod:`shardlab.plan.memory_peak`; 0 without its facts)."""
    offloaded: np.ndarray
    """Activation bytes per micro-batch held in host memory instead (offload_layers; not
    in ``total``)."""

    @property
    def total(self) -> np.ndarray:
        """Weights + gradients + optimizer state + activations + the transient peak."""
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.transient)


ARRAY_KINDS: tuple[str, ...] = tuple(f.name for f in fields(MemoryArrays))
""":class:`MemoryArrays`' fields in order: the kinds each block's rank tables hold."""

COMPARED = 4
"""Pipeline ranks compared per layout when every layer is alike (:func:`_compared`)."""


def _compared(per_rank: list[int]) -> tuple[list[int], bool]:
    """The pipeline ranks whose memory can be the largest when every layer is alike, and
    whether those are enough: ranks 0 (embedding), 1, the middle rank with the most
    layers and pp - 1 (padded to :data:`COMPARED`). A middle rank holds only its layers,
    each with the same parameters and activations; the micro-batches it keeps in flight
    (:func:`inflight`) never grow with the rank and are the same on every rank of a V
    schedule. So rank 1 (the most in flight) and the rank with the most layers bound
    every middle rank when the middle ranks' layers never grow with the rank (the even
    split and :func:`~shardlab.plan.choices.fewer_at_ends` ones) or in a V; otherwise (a
    user's split) the second value is false and every rank is compared."""
    pp = len(per_rank)
    middle = per_rank[1:-1]
    most = 1 + max(range(len(middle)), key=middle.__getitem__) if middle else pp - 1
    falling = all(a >= b for a, b in itertools.pairwise(middle))
    ranks = [0, min(1, pp - 1), most, pp - 1]
    return ranks, falling


def _needs_every_rank(model: ModelShape, c: Candidates) -> bool:
    """Whether some layout's split leaves :func:`_compared`'s ranks short (a user's split
    whose middle ranks grow with the rank, outside a V schedule)."""
    v_shape = np.isin(c.schedule, V_INDEX)
    uniq, _ = unique_rows(c.pp, c.virtual, c.split, v_shape)
    for pp, v, split, vee in uniq.tolist():
        per_rank, _ = rank_placement(model.layers, pp, v, c.splits[split], bool(vee))
        if not vee and not _compared(per_rank)[1]:
            return True
    return False


def _rank_tables(model: ModelShape, c: Candidates, all_ranks: bool
                 ) -> tuple[np.ndarray, ...]:
    """Per layout, at each pipeline rank compared (every one, or the :func:`_compared` ones
    when ``all_ranks`` is false): the rank, its parameters, routed-expert parameters,
    dense layers, MoE layers and whether it holds the head (layouts x ranks compared;
    past a layout's pp the rank is padding and reads 0). Tables are built per distinct
    (tp, pp, v, ep, etp, split, V placement) and only at the ranks compared, so they stay
    as small as the block."""
    v_shape = np.isin(c.schedule, V_INDEX)
    uniq, inv = unique_rows(c.tp, c.pp, c.virtual, c.ep, c.etp, c.split, v_shape)
    width = int(uniq[:, 1].max(initial=1)) if all_ranks else COMPARED
    ranks = np.zeros((len(uniq), width), dtype=np.int64)
    params, experts, dense, moe, heads = (np.zeros((len(uniq), width)) for _ in range(5))
    dense_layers = model.dense_layers
    for i, (tp, pp, v, ep, etp, s, vee) in enumerate(uniq.tolist()):
        split, vee = c.splits[s], bool(vee)
        per_rank, head = rank_placement(model.layers, pp, v, split, vee)
        ranks[i] = np.arange(width) if all_ranks else _compared(per_rank)[0]
        at = np.minimum(ranks[i], pp - 1)
        real = ranks[i] < pp
        sizes = np.array(chunk_layers(model.layers, pp, v, split), dtype=np.int64)
        # Dense layers come first, as in stage_params; chunk c lives on chunk_rank(c).
        d = np.clip(dense_layers - (np.cumsum(sizes) - sizes), 0, sizes)
        k = np.arange(len(sizes))
        on = np.where(k < pp, k, 2 * pp - 1 - k) if vee else k % pp  # partition.chunk_rank
        total = np.array(stage_params(model, tp, pp, v, ep=ep, etp=etp, stage_layers=split,
                                      v_shape=vee), float)
        params[i] = np.where(real, total[at], 0.0)
        routed = np.array(stage_expert_params(model, pp, v, ep, etp, split, vee), float)
        experts[i] = np.where(real, routed[at], 0.0)
        dense[i] = np.where(real, np.bincount(on, weights=d, minlength=pp)[at], 0.0)
        moe[i] = np.where(real, np.bincount(on, weights=sizes - d, minlength=pp)[at], 0.0)
        heads[i] = real & (ranks[i] == head)
    inv = inv.ravel()
    return ranks[inv], params[inv], experts[inv], dense[inv], moe[inv], heads[inv] > 0


def _activation_tables(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                       opt: MemoryOptions) -> tuple[np.ndarray, ...]:
    """Per layout: one dense and one MoE layer's bytes per micro-batch, first and last
    extras (a cp rank's s/cp tokens)."""
    factors, cf_i = np.unique(c.capacity_factor, return_inverse=True)
    uniq, inv = unique_rows(c.micro_batch, c.tp, c.sp, c.recompute, c.ep, c.etp, cf_i.ravel(),
                            c.cp)
    elem = policy.activation_bytes
    rows = []
    for mb, tp, sp, rc, ep, etp, cf, cp in uniq.tolist():
        lay = rank_layout(seq, policy, mb, tp, bool(sp), RECOMPUTE[rc], ep, etp, cp,
                          float(factors[cf]))
        local = seq // cp
        by_op = opt.selective == "op"
        gathered = opt.facts.sp_gathered_inputs if opt.facts is not None else 0
        rows.append((
            saved_layer_bytes(model, lay, False, opt.dropout, opt.flash, by_op, opt.imbalance,
                              opt.recompute_modules, gathered),
            saved_layer_bytes(model, lay, True, opt.dropout, opt.flash, by_op, opt.imbalance,
                              opt.recompute_modules, gathered),
            first_stage_extra_bytes(model, mb, local, tp=tp, sp=bool(sp), dropout=opt.dropout),
            last_stage_extra_bytes(model, mb, local, elem, tp=tp, sp=bool(sp))))
    table = np.array(rows)[inv.ravel()]
    return table[:, 0], table[:, 1], table[:, 2], table[:, 3]


def _fp8_tables(model: ModelShape, c: Candidates, policy: DtypePolicy
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per layout: fp8 copy and scale bytes of one dense and one MoE layer on a rank
    (:func:`shardlab.estimate.fp8.layer_state_bytes`), then their linear weight elements
    (:func:`shardlab.estimate.fp8.linear_weights`), per distinct (tp, ep, etp)."""
    uniq, inv = unique_rows(c.tp, c.ep, c.etp)
    table = np.array([(fp8.layer_state_bytes(model, policy, tp, False),
                       fp8.layer_state_bytes(model, policy, tp, True, ep, etp),
                       fp8.linear_weights(model, tp, False),
                       fp8.linear_weights(model, tp, True, ep, etp))
                      for tp, ep, etp in uniq.tolist()], float).reshape(-1, 4)[inv.ravel()]
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


BLOCK_ELEMENTS = 2**21
"""Layouts x pipeline ranks that :func:`memory_arrays` holds at once (about 17 MB per
float64 table, a dozen tables): a search of many deep layouts goes through in blocks of
layouts rather than building tables of every layout x every rank."""


def _uniform(model: ModelShape) -> bool:
    """Whether every layer is alike (all dense, or all MoE): then only the ranks of
    :func:`_compared` need comparing."""
    return model.dense_layers in (0, model.layers)


def _framework_policy(policy: DtypePolicy, opt: MemoryOptions) -> DtypePolicy:
    """``policy`` with what the framework's memory facts say its layers keep."""
    if policy.is_fp8 and opt.facts is not None and opt.facts.fp8_input_bytes:
        # The framework's fp8 linear layers keep their inputs' fp8 copies for backward.
        policy = replace(policy, input_bytes=opt.facts.fp8_input_bytes)
    if opt.facts is not None and opt.facts.combine_bytes is not None:
        # What the framework's MoE combine keeps for the gates' gradient.
        policy = replace(policy, combine_bytes=opt.facts.combine_bytes)
    return policy


def memory_arrays(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                  opt: MemoryOptions, all_ranks: bool | None = None) -> MemoryArrays:
    """Bytes on the busiest device of every layout in ``c`` (module docstring).

    Ranks compared: every one, or when all layers are alike only those of
    :func:`_compared` (:func:`_uniform`; ``all_ranks`` forces either way, for the tests).
    Computed in blocks of at most :data:`BLOCK_ELEMENTS` layouts x ranks compared.
    """
    if all_ranks is None:
        all_ranks = not _uniform(model) or _needs_every_rank(model, c)
    policy = _framework_policy(policy, opt)

    def width(pp: int) -> int:
        """Ranks compared for a layout of ``pp`` stages."""
        return pp if all_ranks else COMPARED

    if len(c) * width(int(c.pp.max(initial=1))) <= BLOCK_ELEMENTS:
        return _memory_block(model, c, seq, policy, opt, all_ranks)
    # Shallow layouts first, so each block's tables are as wide as its own deepest pipeline.
    order = np.argsort(c.pp, kind="stable")
    depth = c.pp[order]
    keys = ARRAY_KINDS
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


def zero_group_arrays(c: Candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                               np.ndarray]:
    """:func:`shardlab.estimate.states.zero_groups` over arrays: (dense shard group, expert
    shard group, dense replicas, expert replicas) per layout."""
    shard, fold = c.dp_shard, c.expert_fold_ranks  # fold: expert-mesh ranks per dp rank
    after = 1 if c.fold else c.cp  # unfolded, an expert's shards also span cp
    hsdp = (c.dp_replicate > 1) & (shard * fold % c.ep == 0)
    experts = np.where(hsdp, shard * fold // c.ep, c.dp * fold // c.ep) * after
    return shard * c.cp, experts, c.dp_replicate, np.where(hsdp, c.dp_replicate, 1)


def _rank_block(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                opt: MemoryOptions, all_ranks: bool) -> dict[str, np.ndarray]:
    """Bytes by kind at every pipeline rank compared (layouts x ranks; ``total`` is -inf
    past a layout's pp): what :func:`memory_arrays` takes the busiest rank of."""
    rank, params, experts, dense, moe, head = _rank_tables(model, c, all_ranks)
    a_dense, a_moe, first, last = _activation_tables(model, c, seq, policy, opt)
    col = lambda x: np.asarray(x)[:, None]  # noqa: E731 - one layout per row
    valid = rank < col(c.pp)
    k = inflight(col(c.schedule), col(c.pp), rank, col(c.microbatches), col(c.virtual))
    act = (dense * col(a_dense) + moe * col(a_moe)) * k
    # offload_layers: N of the rank's layers keep their activations in host memory.
    off = act * (opt.offload_layers / np.maximum(dense + moe, 1.0))
    act = act - off
    act = act + np.where(rank == 0, k * col(first), 0.0)
    last_k = np.where(col(c.schedule) == SCHEDULES.index("gpipe"), k, 1.0)
    act = act + np.where(head, last_k * col(last), 0.0)
    group, egroup, _, _ = zero_group_arrays(c)
    dp = col(group).astype(float)
    edp = col(egroup).astype(float)
    z = col(c.zero)
    dense_params = params - experts

    def sharded(nbytes: int, stage: int) -> np.ndarray:
        """Bytes of a state kind: the dense part sharded over its group (dp_shard x cp), the
        experts over theirs, from ZeRO ``stage`` up (the :mod:`shardlab.estimate.states`
        formulas)."""
        on = z >= stage
        return nbytes * (dense_params / np.where(on, dp, 1.0) + experts / np.where(on, edp, 1.0))

    w = sharded(policy.weight_bytes, 3)
    if policy.is_fp8:
        # fp8 copies and scales of the rank's linear weights, held whole under ZeRO 0-2.
        f_dense, f_moe, l_dense, l_moe = _fp8_tables(model, c, policy)
        held = dense * col(f_dense) + moe * col(f_moe)
        if opt.fp8_params:
            # fp8 primary weights: each linear weight is its fp8 copy (1 B) and transpose
            # (1 B), with no bf16 weight beside them: 2 B fewer per element.
            held = held - (policy.weight_bytes + policy.fp8_copy_bytes - 2) * (
                dense * col(l_dense) + moe * col(l_moe))
        w = w + np.where(z < 3, held, 0.0)
    facts = opt.facts
    g = sharded(max(policy.grad_bytes, facts.held_grad_bytes if facts else 0), 2)
    o = sharded(policy.optimizer_bytes, 1)
    trans = np.zeros_like(act) if facts is None else transient_bytes(
        model, c, seq, policy, facts, dropout=opt.dropout, flash=opt.flash,
        by_op=opt.selective == "op", rank=rank, dense=dense, moe=moe, head=head,
        modules=opt.recompute_modules)
    total = np.where(valid, w + g + o + act + trans, -np.inf)
    shape = total.shape
    return {"weights": np.broadcast_to(w, shape), "gradients": np.broadcast_to(g, shape),
            "optimizer": np.broadcast_to(o, shape), "activations": act,
            "params": params, "stage": rank, "expert_params": experts,
            "transient": np.broadcast_to(trans, shape), "offloaded": off, "total": total}


def _memory_block(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                  opt: MemoryOptions, all_ranks: bool) -> MemoryArrays:
    """:func:`memory_arrays` of one block: each layout's busiest rank."""
    t = _rank_block(model, c, seq, policy, opt, all_ranks)
    peak = np.argmax(t["total"], axis=1)
    rows = np.arange(len(c))
    return MemoryArrays(*(t[k][rows, peak] for k in ARRAY_KINDS))


def rank_memory(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                opt: MemoryOptions) -> list[dict[str, float]]:
    """Bytes by kind (weights, gradients, optimizer, activations, transient, offloaded,
    total) at each pipeline rank of the first layout of ``c``, rank 0 first: the figures
    :func:`memory_arrays` takes the busiest of (the fit advice weighs what cutting one
    kind would leave on every rank)."""
    one = c.take(np.array([0]))
    t = _rank_block(model, one, seq, _framework_policy(policy, opt), opt, True)
    kinds = ("weights", "gradients", "optimizer", "activations", "transient", "offloaded",
             "total")
    return [{k: float(t[k][0, r]) for k in kinds} for r in range(int(one.pp[0]))]
