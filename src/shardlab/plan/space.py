"""The search space: every layout of a model on N devices, as numpy arrays, with the
reason each one that breaks a rule of :func:`shardlab.config.layout.make_layout` breaks it.

A layout is dp x cp x tp x pp = N (tensor parallel within a node unless ``max_tp`` says
otherwise), virtual stages v, a pipeline schedule, ZeRO stage 0-3 (3 = FSDP), sequence
parallel on/off, recompute none/selective/full and a micro-batch size; the global batch
and the sequence length are the user's. The schedule fixes v: GPipe, 1F1B, ZB-H1 and
ZB-H2 run one chunk per rank, interleaved 1F1B 2 or more, ZB-V and DualPipeV exactly 2;
with pp = 1 the schedule is moot and only 1F1B is listed. Pairs that cannot differ are
not listed twice: ZeRO stages only when dp x cp > 1, sequence parallel only when tp > 1.

A mixture-of-experts model adds expert parallelism: ep runs over the divisors of dp that
divide the routed experts (the ep group is drawn from the data-parallel ranks, as in
torchtitan and Megatron-LM), etp over 1 and tp (whole experts, or each split as the
dense MLP; one value when tp = 1). The capacity factor is the job's, not searched. A
dense model has ep = 1 and etp = tp only.

Beyond those: context parallel cp when sequences are long (ZeRO shards over dp x cp:
torchtitan's ``dp_shard_cp``), HSDP with the shard
group kept within a node (ZeRO 1-3 only: HSDP shards), and beside the even layer split
the first and the last model chunk k layers fewer (:mod:`shardlab.plan.choices`);
``Space.cp``, ``Space.dp_replicate`` and ``Space.stage_layers`` name them instead. A
MoE mesh takes HSDP only when ep divides dp/R. A :class:`Candidates`' ``split`` indexes
its ``splits`` table (0: even).

``train_only`` keeps what ``shardlab train`` runs (its --dp-mode maps ZeRO 0 to ddp,
2 to fsdp-zero2, 3 to fsdp; GPipe, 1F1B and interleaved 1F1B; whole experts, etp = 1;
context parallelism, HSDP and uneven stages of a dense model), so a plan for this
machine always hands over a command that starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from shardlab.config.layout import RECOMPUTE, SCHEDULES, V_SCHEDULES
from shardlab.config.limits import MAX_BATCH, MAX_CANDIDATES, MAX_CONTEXT, MAX_GPUS, MAX_LAYERS
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError, require_int_at_most, require_positive_int
from shardlab.plan.choices import (
    cp_choices,
    divisors,
    expert_choices,
    replica_choices,
    split_choices,
)
from shardlab.plan.rules import check_rules

TRAIN_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b")
TRAIN_ZERO: tuple[int, ...] = (0, 2, 3)
DP_MODE_OF_ZERO: dict[int, str] = {0: "ddp", 2: "fsdp-zero2", 3: "fsdp"}

# Rejection reasons, in the order they are checked (a layout counts under its first).


@dataclass(frozen=True)
class Space:
    """What to search. ``max_tp`` defaults to the devices per node, ``max_pp`` to the layers."""

    gpus: int
    global_batch: int
    seq: int
    gpus_per_node: int = 8
    max_tp: int | None = None
    max_pp: int | None = None
    max_virtual: int = 8
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    schedules: tuple[str, ...] = SCHEDULES
    sp: tuple[bool, ...] = (False, True)
    train_only: bool = False
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees to try (MoE): None, every divisor of dp (with
    :attr:`expert_fold`, of tp·cp·dp/etp) that divides the experts; values that do not
    divide them are skipped there."""
    capacity_factor: float = 0.0
    expert_fold: bool = False
    """The framework folds its expert layers onto their own mesh
    (:attr:`~shardlab.plan.overlap.Framework.expert_fold`): ep divides tp·cp·dp/etp."""
    cp: tuple[int, ...] | None = None
    """Context-parallel degrees to try: None, the long-sequence default
    (:mod:`shardlab.plan.choices`);
    values that do not divide a mesh's devices or cut seq into 2·cp chunks are skipped."""
    dp_replicate: tuple[int, ...] | None = None
    """HSDP replica counts to try: None, 1 and the shard-within-a-node one
    (:mod:`shardlab.plan.choices`); values that do not divide a mesh's dp are skipped."""
    pipeline_max_zero: int | None = None
    """The highest ZeRO stage the framework runs with pipeline parallelism
    (:attr:`~shardlab.plan.overlap.Framework.pipeline_max_zero`; None: any)."""
    stage_layers: tuple[int, ...] = ()
    """One uneven split to use (its length = pp x virtual stages); empty: search the even
    split and :attr:`fewer_at_ends`."""
    fewer_at_ends: tuple[int, ...] = (1, 2)
    """k's of the uneven splits tried (:func:`~shardlab.plan.choices.fewer_at_ends`): the
    first and the last model chunk k layers fewer; () tries the even split only."""

    def __post_init__(self) -> None:
        for name, limit in (("gpus", MAX_GPUS), ("global_batch", MAX_BATCH), ("seq", MAX_CONTEXT),
                            ("gpus_per_node", MAX_GPUS), ("max_tp", MAX_GPUS),
                            ("max_pp", MAX_GPUS), ("max_virtual", MAX_LAYERS)):
            value = getattr(self, name)
            if value is not None:
                require_int_at_most(name, require_positive_int(name, value), limit)
        for mb in self.micro_batches:
            require_int_at_most("micro_batch", require_positive_int("micro_batch", mb),
                                MAX_BATCH)
        for s in self.schedules:
            if s not in SCHEDULES:
                raise SpecError("schedule", s, f"must be one of {', '.join(SCHEDULES)}")
        for z in self.zero:
            if z not in (0, 1, 2, 3):
                raise SpecError("zero", z, "must be 0, 1, 2 or 3 (3 is FSDP)")
        for r in self.recompute:
            if r not in RECOMPUTE:
                raise SpecError("recompute", r, f"must be one of {', '.join(RECOMPUTE)}")
        for name in ("ep", "cp", "dp_replicate"):
            for e in getattr(self, name) or ():
                require_int_at_most(name, require_positive_int(name, e), MAX_GPUS)
        for n in self.stage_layers:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise SpecError("stage_layers", "+".join(map(str, self.stage_layers)),
                                "must give every stage at least one layer")
        for k in self.fewer_at_ends:
            require_int_at_most("fewer_at_ends", require_positive_int("fewer_at_ends", k),
                                MAX_LAYERS)
        cf = self.capacity_factor
        if isinstance(cf, bool) or not (0 <= cf < math.inf):
            raise SpecError("capacity_factor", cf, "must be 0 (dropless) or a finite number > 0")


@dataclass
class Candidates:
    """Layouts as parallel integer arrays (one entry per layout).

    ``schedule`` indexes :data:`shardlab.config.layout.SCHEDULES`, ``recompute``
    :data:`shardlab.config.layout.RECOMPUTE`; ``reason`` is -1 for a valid layout, else the
    index in :data:`REASONS` of the first rule it breaks. ``ep`` and ``etp`` are the
    expert-parallel and expert tensor-parallel degrees (1 and tp for a dense model),
    ``capacity_factor`` the MoE capacity factor (0: dropless). ``cp`` is the
    context-parallel degree, ``dp_replicate`` HSDP's replicas (1: none), ``split`` an
    index into ``splits``, the per-chunk layer counts of the uneven splits (``()`` first:
    the even split); ``splits`` is shared, not per layout.
    """

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    virtual: np.ndarray
    schedule: np.ndarray
    zero: np.ndarray
    sp: np.ndarray
    recompute: np.ndarray
    micro_batch: np.ndarray
    microbatches: np.ndarray
    reason: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    capacity_factor: np.ndarray
    cp: np.ndarray
    dp_replicate: np.ndarray
    split: np.ndarray
    splits: tuple[tuple[int, ...], ...] = ((),)
    fold: bool = False
    """Shared: the expert layers take their own mesh (:attr:`Space.expert_fold`)."""

    def __len__(self) -> int:
        return len(self.dp)

    def take(self, idx: np.ndarray) -> Candidates:
        """The layouts at ``idx`` (an index array or a boolean mask)."""
        return Candidates(**{k: v[idx] if isinstance(v, np.ndarray) else v
                             for k, v in vars(self).items()})

    @property
    def dp_shard(self) -> np.ndarray:
        """Ranks of one HSDP replica: dp / dp_replicate."""
        return self.dp // self.dp_replicate

    @property
    def gpus(self) -> np.ndarray:
        """Devices of each layout: dp x cp x tp x pp."""
        return self.dp * self.cp * self.tp * self.pp

    @property
    def expert_fold_ranks(self) -> np.ndarray:
        """Ranks of a stage's expert mesh per data-parallel rank: cp·tp/etp with folding
        (the expert mesh spans tp·cp·dp/etp ranks), 1 without (it spans dp)."""
        return self.cp * (self.tp // self.etp) if self.fold else np.ones_like(self.dp)

    def layout(self, i: int) -> dict[str, object]:
        """Layout ``i`` as plain values: dp, tp, pp, virtual_stages, micro_batch, ...,
        cp, dp_replicate and stage_layers (``()``: the even split)."""
        return {"dp": int(self.dp[i]), "tp": int(self.tp[i]), "pp": int(self.pp[i]),
                "virtual_stages": int(self.virtual[i]),
                "micro_batch": int(self.micro_batch[i]),
                "microbatches": int(self.microbatches[i]), "zero": int(self.zero[i]),
                "sp": bool(self.sp[i]), "recompute": RECOMPUTE[int(self.recompute[i])],
                "schedule": SCHEDULES[int(self.schedule[i])], "ep": int(self.ep[i]),
                "etp": int(self.etp[i]), "capacity_factor": float(self.capacity_factor[i]),
                "cp": int(self.cp[i]), "dp_replicate": int(self.dp_replicate[i]),
                "stage_layers": self.splits[int(self.split[i])]}


def unique_rows(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)`` for columns of
    integers >= 0, as one integer key per row when they fit in 63 bits (sorting one int64
    column is many times faster than sorting rows; the order is the same)."""
    cols = [np.asarray(x, dtype=np.int64).ravel() for x in columns]
    radix = [int(x.max(initial=0)) + 1 for x in cols]
    if math.prod(radix) >= 2**62 or any(int(x.min(initial=0)) < 0 for x in cols):
        uniq, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        return uniq, inv.ravel()
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for x, r in zip(cols, radix, strict=True):
        key = key * r + x
    ukey, inv = np.unique(key, return_inverse=True)
    uniq = np.empty((len(ukey), len(cols)), dtype=np.int64)
    for j in range(len(cols) - 1, -1, -1):
        ukey, uniq[:, j] = np.divmod(ukey, radix[j])
    return uniq, inv.ravel()


def _splits(model: ModelShape, sp: Space, pp: int, v: int) -> list[tuple[int, ...]]:
    """:func:`~shardlab.plan.choices.split_choices` of the space."""
    return split_choices(model.layers, pp, v, sp.stage_layers, sp.fewer_at_ends)


def _meshes(model: ModelShape, sp: Space
            ) -> list[tuple[int, int, int, int, int, range, list[tuple[int, int]], int]]:
    """(dp, cp, tp, pp, schedule index, the virtual stages v it takes, the (ep, etp)
    pairs, dp_replicate) of every mesh, schedule and HSDP degree the space allows, in
    search order (tp, cp, pp, schedule, dp_replicate)."""
    max_tp = sp.max_tp or sp.gpus_per_node
    max_pp = sp.max_pp or model.layers
    schedules = [s for s in sp.schedules if not sp.train_only or s in TRAIN_SCHEDULES]
    out = []
    for tp in divisors(sp.gpus):
        if tp > max_tp:
            continue
        for cp in cp_choices(sp.gpus // tp, sp.seq, sp.cp):
            for pp in divisors(sp.gpus // (tp * cp)):
                if pp > max_pp:
                    continue
                dp = sp.gpus // (tp * cp * pp)
                experts = expert_choices(model, dp, tp, sp.ep, cp, sp.expert_fold)
                if not experts:
                    continue
                runs = []
                if pp == 1:
                    runs = [(SCHEDULES.index("1f1b"), range(1, 2))]
                for name in schedules if pp > 1 else ():
                    if name == "interleaved-1f1b":
                        vs = range(2, sp.max_virtual + 1)
                    elif name in V_SCHEDULES:
                        vs = range(2, 3) if sp.max_virtual >= 2 else range(0)
                    else:
                        vs = range(1, 2)
                    runs.append((SCHEDULES.index(name), vs))
                replicas = replica_choices(dp, cp, tp, sp.gpus_per_node, sp.dp_replicate)
                for r in replicas:
                    # HSDP of a MoE: the ep group must fit in one replica's dp/R ranks
                    # (x cp·tp/etp with folding).
                    ex = [(e, et) for e, et in experts if r == 1 or (
                        (dp // r) * (cp * (tp // et) if sp.expert_fold else 1)) % e == 0]
                    if ex:
                        out += [(dp, cp, tp, pp, sched, vs, ex, r) for sched, vs in runs]
    return out


def enumerate_space(model: ModelShape, sp: Space) -> Candidates:
    """Every layout of the space, each with the first rule it breaks (or -1).

    The order is the meshes' (tp, then cp, pp, schedule, dp_replicate), then within each
    v, the split and (ep, etp), then the product ZeRO x sequence parallel x recompute x
    micro-batch, built with numpy. A space of more than
    :data:`~shardlab.config.limits.MAX_CANDIDATES` layouts is refused before anything is
    built (counted first without the splits, whose count needs each v).
    """
    zero_all = np.array([z for z in sp.zero if not sp.train_only or z in TRAIN_ZERO],
                        dtype=np.int64)
    rc_idx = np.array([RECOMPUTE.index(r) for r in sp.recompute], dtype=np.int64)
    mbs = np.array(sp.micro_batches, dtype=np.int64)
    sps = np.array(sp.sp, dtype=bool)
    meshes = _meshes(model, sp)
    # Layouts per structure (one mesh, schedule, v, replicas, split and (ep, etp)): zeros x
    # sp x recompute x micro-batch, where dp x cp = 1 has only ZeRO 0 and tp = 1 no
    # sequence parallel.
    inner = len(rc_idx) * len(mbs)

    # HSDP shards, so its structures take ZeRO >= 1 only (R_HSDP flags a given one).
    zero_sharded = zero_all[zero_all > 0]

    def per_structure(dp: int, cp: int, tp: int, r: int = 1) -> int:
        zeros = len(zero_sharded) if r > 1 else len(zero_all) if dp * cp > 1 else 1
        return zeros * (len(sps) if tp > 1 else 1) * inner

    def refuse(total: int) -> None:
        if total > MAX_CANDIDATES:
            raise SpecError("layouts", total, f"a search evaluates at most "
                            f"{MAX_CANDIDATES:,}: narrow it with --max-tp, --max-pp, "
                            "--max-virtual, --micro-batches, --zero, --recompute, "
                            "--schedules, --cp or --dp-replicate")

    refuse(sum(len(vs) * len(ex) * per_structure(dp, cp, tp, r)
               for dp, cp, tp, _, _, vs, ex, r in meshes if not sp.stage_layers))
    splits: dict[tuple[int, ...], int] = {(): 0}
    rows = []
    for dp, cp, tp, pp, sched, vs, ex, r in meshes:
        for v in vs:
            for s in _splits(model, sp, pp, v):
                index = splits.setdefault(s, len(splits))
                rows += [(dp, cp, tp, pp, sched, v, r, index, e, et) for e, et in ex]
    st = np.array(rows, dtype=np.int64).reshape(-1, 10)
    nz = np.where(st[:, 6] > 1, len(zero_sharded),
                  np.where(st[:, 0] * st[:, 1] > 1, len(zero_all), 1))
    ns = np.where(st[:, 2] > 1, len(sps), 1)
    size = nz * ns * inner
    total = int(size.sum())
    refuse(total)
    if not total:
        if sp.ep is not None and model.moe is not None:
            given = sp.ep[0] if len(sp.ep) == 1 else ",".join(map(str, sp.ep))
            raise SpecError("ep", given, "divides no mesh's dp and the "
                            f"experts ({model.moe.experts}) on {sp.gpus} devices")
        if sp.dp_replicate is not None and 1 not in sp.dp_replicate and max(sp.zero) < 1:
            raise SpecError("dp_replicate", ",".join(map(str, sp.dp_replicate)), "needs "
                            "ZeRO >= 1 (HSDP shards inside each replica): add 1, 2 or 3 to "
                            "--zero")
        for name in ("cp", "dp_replicate"):
            given = getattr(sp, name)
            if given is not None and 1 not in given:
                raise SpecError(name, ",".join(map(str, given)), "fits no mesh of "
                                f"{sp.gpus} devices" + (f" (or does not cut seq={sp.seq} "
                                "into 2*cp equal chunks)" if name == "cp" else ""))
        if sp.stage_layers:
            raise SpecError("stage_layers", "+".join(map(str, sp.stage_layers)),
                            f"gives {len(sp.stage_layers)} stages: no pp x virtual stages "
                            f"on {sp.gpus} devices within the limits makes that many")
        raise SpecError("gpus", sp.gpus, "leaves no layout within the limits of "
                        f"--max-tp/--max-pp ({sp.max_tp or sp.gpus_per_node}/"
                        f"{sp.max_pp or model.layers})")
    row = np.repeat(np.arange(len(st)), size)
    # Position inside the structure's product, decoded as itertools.product would order it.
    j = np.arange(total) - np.repeat(np.cumsum(size) - size, size)
    mb_i = j % len(mbs)
    rc_i = (j // len(mbs)) % len(rc_idx)
    sp_i = (j // inner) % ns[row]
    z_i = j // (inner * ns[row])
    dp, cp, tp, pp, sched, v, rep, split, ep, etp = (st[row, k] for k in range(10))
    # (An empty list of choices has no layouts above: index a stand-in, never used.)
    stand_in = np.zeros(1, np.int64)
    zero = np.where(dp * cp > 1, (zero_all if len(zero_all) else stand_in)[z_i], 0)
    zero = np.where(rep > 1, (zero_sharded if len(zero_sharded) else stand_in)[
        np.minimum(z_i, max(len(zero_sharded) - 1, 0))], zero)
    spar = np.where(tp > 1, (sps if len(sps) else np.zeros(1, bool))[sp_i], False)
    mb = mbs[mb_i]
    m = sp.global_batch // (dp * mb)
    c = Candidates(dp, tp, pp, v, sched, zero, spar, rc_idx[rc_i], mb, m,
                   np.full(total, -1, dtype=np.int64), ep, etp,
                   np.full(total, float(sp.capacity_factor)), cp, rep, split, tuple(splits),
                   sp.expert_fold)
    check_rules(model, sp, c)
    return c


def enumerate_search(model: ModelShape, sp: Space) -> tuple[Candidates, str | None]:
    """:func:`enumerate_space`, or, when the uneven splits alone take it past
    :data:`~shardlab.config.limits.MAX_CANDIDATES` (the deepest models on the most
    devices), the space with the even split only and a note saying so."""
    try:
        return enumerate_space(model, sp), None
    except SpecError as e:
        if e.field != "layouts" or not sp.fewer_at_ends or sp.stage_layers:
            raise
        c = enumerate_space(model, replace(sp, fewer_at_ends=()))
        return c, (f"uneven pipeline splits not searched: with them the space has "
                   f"{e.value:,} layouts, more than {MAX_CANDIDATES:,}; give one with "
                   "--stage-layers or narrow the search")
