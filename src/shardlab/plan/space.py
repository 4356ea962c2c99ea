"""The search space: every layout of a model on N devices, as numpy arrays, with the
reason each one that breaks a rule of :func:`shardlab.config.layout.make_layout` breaks it.

A layout is dp x tp x pp = N (tensor parallel within a node unless ``max_tp`` says
otherwise), virtual stages v, a pipeline schedule, ZeRO stage 0-3 (3 = FSDP), sequence
parallel on/off, recompute none/selective/full and a micro-batch size; the global batch
and the sequence length are the user's. The schedule fixes v: GPipe, 1F1B, ZB-H1 and
ZB-H2 run one chunk per rank, interleaved 1F1B 2 or more, ZB-V and DualPipeV exactly 2;
with pp = 1 the schedule is moot and only 1F1B is listed. Pairs that cannot differ are
not listed twice: ZeRO stages only when dp > 1, sequence parallel only when tp > 1.

A mixture-of-experts model adds expert parallelism: ep runs over the divisors of dp that
divide the routed experts (the ep group is drawn from the data-parallel ranks, as in
torchtitan and Megatron-LM), etp over 1 and tp (whole experts, or each split as the
dense MLP; one value when tp = 1). The capacity factor is the job's, not searched. A
dense model has ep = 1 and etp = tp only.

``train_only`` keeps what ``shardlab train`` runs (its --dp-mode maps ZeRO 0 to ddp,
2 to fsdp-zero2, 3 to fsdp; GPipe, 1F1B and interleaved 1F1B; whole experts, etp = 1),
so a plan for this machine always hands over a command that starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardlab.config.layout import RECOMPUTE, SCHEDULES, V_SCHEDULES
from shardlab.config.limits import MAX_BATCH, MAX_CANDIDATES, MAX_CONTEXT, MAX_GPUS, MAX_LAYERS
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError, require_int_at_most, require_positive_int

TRAIN_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b")
TRAIN_ZERO: tuple[int, ...] = (0, 2, 3)
DP_MODE_OF_ZERO: dict[int, str] = {0: "ddp", 2: "fsdp-zero2", 3: "fsdp"}

# Rejection reasons, in the order they are checked (a layout counts under its first).
R_TP = "tp does not divide heads, kv heads or d_ff"
R_EP = "ep does not divide dp or the experts"
R_CHUNKS = "pp x virtual stages exceeds the layers"
R_BATCH = "global batch not a multiple of dp x micro-batch"
R_SP = "seq not divisible by tp (sequence parallel)"
R_INTERLEAVED = "interleaved-1f1b needs micro-batches in multiples of pp"
R_DUALPIPE = "dualpipev needs at least 2 x pp micro-batches"
R_TRAIN = "not supported by shardlab train"
R_MEMORY = "out of memory"
REASONS: tuple[str, ...] = (R_TP, R_EP, R_CHUNKS, R_BATCH, R_SP, R_INTERLEAVED, R_DUALPIPE, R_TRAIN,
                            R_MEMORY)


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
    """Expert-parallel degrees to try (MoE): None, every divisor of dp that divides the
    experts; values that do not divide a mesh's dp or the experts are skipped there."""
    capacity_factor: float = 0.0

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
        for e in self.ep or ():
            require_int_at_most("ep", require_positive_int("ep", e), MAX_GPUS)
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
    ``capacity_factor`` the MoE capacity factor (0: dropless).
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

    def __len__(self) -> int:
        return len(self.dp)

    def take(self, idx: np.ndarray) -> Candidates:
        """The layouts at ``idx`` (an index array or a boolean mask)."""
        return Candidates(**{k: v[idx] for k, v in vars(self).items()})

    def layout(self, i: int) -> dict[str, object]:
        """Layout ``i`` as plain values: dp, tp, pp, virtual_stages, micro_batch, ..."""
        return {"dp": int(self.dp[i]), "tp": int(self.tp[i]), "pp": int(self.pp[i]),
                "virtual_stages": int(self.virtual[i]),
                "micro_batch": int(self.micro_batch[i]),
                "microbatches": int(self.microbatches[i]), "zero": int(self.zero[i]),
                "sp": bool(self.sp[i]), "recompute": RECOMPUTE[int(self.recompute[i])],
                "schedule": SCHEDULES[int(self.schedule[i])], "ep": int(self.ep[i]),
                "etp": int(self.etp[i]), "capacity_factor": float(self.capacity_factor[i])}


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


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (pairs d, n/d up to sqrt(n): fast for any n <= 2^20)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def expert_choices(model: ModelShape, dp: int, tp: int, eps: tuple[int, ...] | None = None
                   ) -> list[tuple[int, int]]:
    """(ep, etp) pairs a mesh of ``dp`` x ``tp`` allows (module docstring): (1, tp) for a
    dense model; else each ep dividing dp and the experts (of ``eps`` when given) with
    etp = tp, then etp = 1 when tp > 1."""
    if model.moe is None:
        return [(1, tp)]
    experts = model.moe.experts
    out = [(e, tp) for e in divisors(dp) if experts % e == 0 and (eps is None or e in eps)]
    return out + ([(e, 1) for e, _ in out] if tp > 1 else [])


def _meshes(model: ModelShape, sp: Space
            ) -> list[tuple[int, int, int, int, range, list[tuple[int, int]]]]:
    """(dp, tp, pp, schedule index, the virtual stages v it takes, the (ep, etp) pairs)
    of every mesh and schedule the space allows, in search order."""
    max_tp = sp.max_tp or sp.gpus_per_node
    max_pp = sp.max_pp or model.layers
    schedules = [s for s in sp.schedules if not sp.train_only or s in TRAIN_SCHEDULES]
    out = []
    for tp in divisors(sp.gpus):
        if tp > max_tp:
            continue
        for pp in divisors(sp.gpus // tp):
            if pp > max_pp:
                continue
            dp = sp.gpus // (tp * pp)
            experts = expert_choices(model, dp, tp, sp.ep)
            if not experts:
                continue
            if pp == 1:
                out.append((dp, tp, 1, SCHEDULES.index("1f1b"), range(1, 2), experts))
                continue
            for name in schedules:
                if name == "interleaved-1f1b":
                    vs = range(2, sp.max_virtual + 1)
                elif name in V_SCHEDULES:
                    vs = range(2, 3) if sp.max_virtual >= 2 else range(0)
                else:
                    vs = range(1, 2)
                out.append((dp, tp, pp, SCHEDULES.index(name), vs, experts))
    return out


def enumerate_space(model: ModelShape, sp: Space) -> Candidates:
    """Every layout of the space, each with the first rule it breaks (or -1).

    The order is the meshes' (tp, then pp, then schedule, v and (ep, etp)), and within
    each the product ZeRO x sequence parallel x recompute x micro-batch, built with numpy.
    A space
    of more than :data:`~shardlab.config.limits.MAX_CANDIDATES` layouts is refused
    before anything is built.
    """
    zero_all = np.array([z for z in sp.zero if not sp.train_only or z in TRAIN_ZERO],
                        dtype=np.int64)
    rc_idx = np.array([RECOMPUTE.index(r) for r in sp.recompute], dtype=np.int64)
    mbs = np.array(sp.micro_batches, dtype=np.int64)
    sps = np.array(sp.sp, dtype=bool)
    meshes = _meshes(model, sp)
    # Layouts per structure (one mesh, schedule and v): zeros x sp x recompute x micro-batch,
    # where dp = 1 has only ZeRO 0 and tp = 1 no sequence parallel.
    inner = len(rc_idx) * len(mbs)
    per_mesh = [len(vs) * len(ex) * (len(zero_all) if dp > 1 else 1)
                * (len(sps) if tp > 1 else 1) * inner for dp, tp, _, _, vs, ex in meshes]
    total = sum(per_mesh)
    if total > MAX_CANDIDATES:
        raise SpecError("layouts", total, f"a search evaluates at most {MAX_CANDIDATES:,}: "
                        "narrow it with --max-tp, --max-pp, --max-virtual, --micro-batches, "
                        "--zero, --recompute or --schedules")
    if not total:
        if sp.ep is not None and model.moe is not None:
            given = sp.ep[0] if len(sp.ep) == 1 else ",".join(map(str, sp.ep))
            raise SpecError("ep", given, "divides no mesh's dp and the "
                            f"experts ({model.moe.experts}) on {sp.gpus} devices")
        raise SpecError("gpus", sp.gpus, "leaves no layout within the limits of "
                        f"--max-tp/--max-pp ({sp.max_tp or sp.gpus_per_node}/"
                        f"{sp.max_pp or model.layers})")
    st = np.array([(dp, tp, pp, sched, v, e, et) for dp, tp, pp, sched, vs, ex in meshes
                   for v in vs for e, et in ex], dtype=np.int64).reshape(-1, 7)
    nz = np.where(st[:, 0] > 1, len(zero_all), 1)
    ns = np.where(st[:, 1] > 1, len(sps), 1)
    size = nz * ns * inner
    row = np.repeat(np.arange(len(st)), size)
    # Position inside the structure's product, decoded as itertools.product would order it.
    j = np.arange(total) - np.repeat(np.cumsum(size) - size, size)
    mb_i = j % len(mbs)
    rc_i = (j // len(mbs)) % len(rc_idx)
    sp_i = (j // inner) % ns[row]
    z_i = j // (inner * ns[row])
    dp, tp, pp, sched, v, ep, etp = (st[row, k] for k in range(7))
    # (An empty list of choices has no layouts above: index a stand-in, never used.)
    zero = np.where(dp > 1, (zero_all if len(zero_all) else np.zeros(1, np.int64))[z_i], 0)
    spar = np.where(tp > 1, (sps if len(sps) else np.zeros(1, bool))[sp_i], False)
    mb = mbs[mb_i]
    m = sp.global_batch // (dp * mb)
    c = Candidates(dp, tp, pp, v, sched, zero, spar, rc_idx[rc_i], mb, m,
                   np.full(total, -1, dtype=np.int64), ep, etp,
                   np.full(total, float(sp.capacity_factor)))
    check_rules(model, sp, c)
    return c


def _mark(c: Candidates, bad: np.ndarray, reason: str) -> None:
    c.reason[(c.reason < 0) & bad] = REASONS.index(reason)


def check_rules(model: ModelShape, sp: Space, c: Candidates) -> None:
    """Set ``c.reason`` for every layout that :func:`make_layout` (or train) would refuse."""
    bad_tp = (model.heads % c.tp != 0) | (model.kv_heads % c.tp != 0) | (model.d_ff % c.tp != 0)
    if model.moe is not None:
        bad_tp |= (c.etp > 1) & (model.moe.expert_d_ff % c.tp != 0)
    _mark(c, bad_tp, R_TP)
    experts = model.moe.experts if model.moe is not None else 1
    _mark(c, (c.dp % c.ep != 0) | (experts % c.ep != 0), R_EP)
    _mark(c, c.pp * c.virtual > model.layers, R_CHUNKS)
    _mark(c, sp.global_batch % (c.dp * c.micro_batch) != 0, R_BATCH)
    _mark(c, c.sp & (sp.seq % c.tp != 0), R_SP)
    inter = c.schedule == SCHEDULES.index("interleaved-1f1b")
    _mark(c, inter & (c.microbatches % c.pp != 0), R_INTERLEAVED)
    _mark(c, (c.schedule == SCHEDULES.index("dualpipev")) & (c.microbatches < 2 * c.pp),
          R_DUALPIPE)
    if sp.train_only:
        # shardlab train (train.config.check_config): no tied head split over stages with
        # tp > 1; DDP holds no DTensors and runs in no pipeline; torch's 1F1B needs at
        # least pp micro-batches.
        bad = (c.tp > 1) & (c.pp > 1) & model.tied
        bad |= (c.zero == 0) & (c.dp > 1) & ((c.tp > 1) | (c.pp > 1))
        bad |= (c.pp > 1) & (c.schedule == SCHEDULES.index("1f1b")) & (c.microbatches < c.pp)
        if model.moe is not None:
            bad |= c.etp != 1  # train builds whole experts on every tp rank (etp = 1)
        _mark(c, bad, R_TRAIN)
