"""Generators of the pipeline schedules shardlab knows, each checking its preconditions.

=================  ===================================================================
kind               what it is (source)
=================  ===================================================================
gpipe              all forwards, then all backwards (Huang et al. 2019)
1f1b               p - r - 1 warm-up forwards, then one forward one backward
                   (PipeDream-Flush, Narayanan et al. 2021)
interleaved-1f1b   v chunks per rank in a loop, depth-first in groups of p micro-batches
                   (Narayanan et al. 2021; Megatron-LM; torch Interleaved1F1B)
zb-h1              1F1B with backward split into I and W; rank r postpones its W by r
                   steps to fill the cool-down (Qi et al. 2024, Sec. 3; the order torch's
                   InterleavedZeroBubble gives with one chunk)
zb-h2              greedy: input gradients first, then forwards while fewer than 2p - 1
                   micro-batches are held, then weight gradients; no bubble inside any
                   rank's span, at up to 2p - 1 micro-batches in flight (Qi et al. 2024)
zb-v               two chunks per rank in a V, zero bubble at 1F1B's memory
                   (Qi et al. 2024, Sec. 6; torch ZBVZeroBubble)
dualpipev          DeepSeek's DualPipe folded into a V on p ranks, forward of one chunk
                   overlapped with backward of the other (DeepSeek-V3 report 2024;
                   torch DualPipeV)
=================  ===================================================================

The per-rank order of gpipe, 1f1b, interleaved-1f1b, zb-v and dualpipev is the one
``torch.distributed.pipelining`` 2.13 runs (tested against its ``pipeline_order``);
DualPipeV's overlapped forward+backward pairs are listed as the forward, then the
backward.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from itertools import repeat

from shardlab.errors import SpecError, require_positive_int
from shardlab.schedules.actions import Action, Schedule, loop_placement, v_placement

Ranks = list[list[Action]]


def gpipe(p: int, m: int) -> Ranks:
    """Every rank: forwards of all micro-batches, then their backwards in the same order."""
    return [[Action("F", r, i) for i in range(m)] + [Action("B", r, i) for i in range(m)]
            for r in range(p)]


def one_f_one_b(p: int, m: int) -> Ranks:
    """Rank r: min(p - r - 1, m) warm-up forwards, then F/B pairs, then the last backwards."""
    out = []
    for r in range(p):
        warm = min(p - r - 1, m)
        acts = [Action("F", r, i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action("F", r, warm + i), Action("B", r, i)]
        acts += [Action("B", r, i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def _steady_1f1b(p: int, v: int, m: int, r: int, warm: int,
                 w_delay: int | None) -> list[Action]:
    """One rank of a (possibly interleaved, possibly split-backward) 1F1B schedule.

    Operation k of the v*m forwards goes to local chunk (k // p) % v (depth-first in
    groups of p micro-batches); backward k to chunk v - 1 - (k // p) % v. Either is that
    chunk's micro-batch (k // pv)·p + k mod p: the p operations before it in each earlier
    group of pv, and k mod p in its own. With ``w_delay`` set, backward is I and each W
    follows ``w_delay`` steps later.
    """
    total, group = v * m, p * v
    # Whole lists made by C loops (map over tuple.__new__) rather than a Python call and a
    # counter per action: interleaved 1F1B, 131,072 actions, in 0.27 s rather than 0.33 s.
    mbs = [(k // group) * p + k % p for k in range(total)]
    fwd = list(map(Action._make, zip(repeat("F"), [((k // p) % v) * p + r for k in range(total)],
                                      mbs, strict=False)))
    bwd_stages = [(v - 1 - (k // p) % v) * p + r for k in range(total)]
    bwd = list(map(Action._make, zip(repeat("B" if w_delay is None else "I"), bwd_stages, mbs,
                                      strict=False)))
    weights = ([] if w_delay is None else
               list(map(Action._make, zip(repeat("W"), bwd_stages, mbs, strict=False))))
    acts = fwd[:warm]
    add = acts.append
    for k in range(total):
        if k < total - warm:
            add(fwd[warm + k])
        add(bwd[k])
        if w_delay is not None and k >= w_delay:
            add(weights[k - w_delay])
    if w_delay is not None:
        acts += weights[max(0, total - w_delay):]  # the Ws still pending at the end
    return acts


def interleaved_1f1b(p: int, m: int, v: int) -> Ranks:
    """Rank r warms up with (v - 1)·p + 2(p - r - 1) forwards (Megatron-LM), then 1F1B."""
    return [_steady_1f1b(p, v, m, r, min((v - 1) * p + 2 * (p - r - 1), v * m), None)
            for r in range(p)]


def zb_h1(p: int, m: int) -> Ranks:
    """1F1B's warm-up, backward split into I and W, rank r's W delayed by r steps."""
    return [_steady_1f1b(p, 1, m, r, min(p - r - 1, m), r) for r in range(p)]


def zb_h2(p: int, m: int) -> Ranks:
    """ZB-H2 as a greedy list schedule in unit steps (Qi et al. 2024, Sec. 3.1).

    At every step each rank runs, in this priority, a ready input gradient I (it is on
    the critical path), else the next forward if fewer than 2p - 1 micro-batches hold
    activations on this rank (held from F until W), else its oldest pending weight
    gradient W, else nothing. With T_F = T_B = T_W this fills both the warm-up and the
    cool-down: rank r is busy without a gap from r to 3m + r, the paper's
    parallelogram, holding at most 2p - 1 micro-batches.
    """
    cap = 2 * p - 1
    f_done = [[-1] * m for _ in range(p)]  # step at which F(r, i) finished, -1: not yet
    i_done = [[-1] * m for _ in range(p)]
    next_f, next_i, held = [0] * p, [0] * p, [0] * p
    pending: list[deque[int]] = [deque() for _ in range(p)]
    out: Ranks = [[] for _ in range(p)]
    remaining, step = 3 * m * p, 0
    while remaining:
        for r in range(p):
            i, f = next_i[r], next_f[r]
            if (i < m and 0 <= f_done[r][i] <= step
                    and (r == p - 1 or 0 <= i_done[r + 1][i] <= step)):
                out[r].append(Action("I", r, i))
                i_done[r][i] = step + 1
                next_i[r] += 1
                pending[r].append(i)
            elif f < m and held[r] < cap and (r == 0 or 0 <= f_done[r - 1][f] <= step):
                out[r].append(Action("F", r, f))
                f_done[r][f] = step + 1
                next_f[r] += 1
                held[r] += 1
            elif pending[r]:
                out[r].append(Action("W", r, pending[r].popleft()))
                held[r] -= 1
            else:
                continue
            remaining -= 1
        step += 1
    return out


def zb_v(p: int, m: int) -> Ranks:
    """ZB-V (Qi et al. 2024, Sec. 6), the order of torch's ZBVZeroBubble.

    Chunk 0 (stage r) descends, chunk 1 (stage 2p - 1 - r) climbs back. The order is
    built for n = max(m, 2p - 1) micro-batches and the extra ones dropped, as torch does.
    """
    n = max(m, 2 * p - 1)
    out = []
    for r in range(p):
        s0, s1 = r, 2 * p - 1 - r
        cnt = {"f0": 0, "f1": 0, "b0": 0, "b1": 0}
        acts: list[Action] = []

        def add(kind: str, stage: int, counter: str, acts: list[Action] = acts,
                cnt: dict[str, int] = cnt) -> None:
            acts.append(Action(kind, stage, cnt[counter]))
            if kind != "I":  # an I is followed by its W, which advances the counter
                cnt[counter] += 1

        for _ in range(2 * (p - r) - 1):
            add("F", s0, "f0")
        for _ in range(r):
            add("F", s1, "f1")
            add("F", s0, "f0")
        for _ in range(p - r):
            add("F", s1, "f1")
            add("I", s1, "b1")
            add("W", s1, "b1")
        while cnt["f1"] < cnt["f0"] or cnt["f0"] < n:
            if cnt["f0"] < n:
                add("F", s0, "f0")
            add("I", s0, "b0")
            add("W", s0, "b0")
            add("F", s1, "f1")
            add("I", s1, "b1")
            add("W", s1, "b1")
        # Cool-down: input gradients first, weight gradients after.
        w0, w1 = cnt["b0"], cnt["b1"]
        for _ in range(r):
            acts += [Action("I", s0, cnt["b0"]), Action("I", s1, cnt["b1"])]
            cnt["b0"] += 1
            cnt["b1"] += 1
        for _ in range(p - r):
            acts += [Action("I", s0, cnt["b0"]), Action("W", s0, w0)]
            cnt["b0"] += 1
            w0 += 1
        acts += [Action("W", s1, i) for i in range(w1, cnt["b1"])]
        acts += [Action("W", s0, i) for i in range(w0, cnt["b0"])]
        out.append([a for a in acts if a.microbatch < m])
    return out


def dualpipev(p: int, m: int) -> Ranks:
    """DualPipeV (DeepSeek-V3 report; torch's ScheduleDualPipeV), overlaps listed F then B."""
    out = []
    for r in range(p):
        s0, s1 = r, 2 * p - 1 - r
        nxt: dict[tuple[int, str], int] = defaultdict(int)  # (stage, F|bwd) -> next mb
        weights: deque[Action] = deque()
        acts: list[Action] = []

        def add(kind: str, stage: int, acts: list[Action] = acts,
                nxt: dict[tuple[int, str], int] = nxt, weights: deque[Action] = weights
                ) -> None:
            counter = (stage, "F" if kind == "F" else "bwd")
            mb = nxt[counter]
            nxt[counter] = mb + 1
            acts.append(Action(kind, stage, mb))
            if kind == "I":
                weights.append(Action("W", stage, mb))

        def weight(acts: list[Action] = acts, weights: deque[Action] = weights) -> None:
            if weights:
                acts.append(weights.popleft())

        for _ in range(2 * (p - r - 1)):
            add("F", s0)
        for _ in range(r + 1):
            add("F", s0)
            add("F", s1)
        for _ in range(p - r - 1):
            add("I", s1)
            weight()
            add("F", s1)
        for i in range(m - 2 * p + r + 1):
            add("F", s0)  # overlapped with the next backward in DualPipe
            add("B", s1)
            add("F", s1)
            add("B", s0)
            del i
        for _ in range(p - r - 1):
            add("B", s1)
            add("F", s1)
            add("B", s0)
        split = False
        for i in range(r + 1):
            if i == (r + 1) // 2 and r % 2 == 1:
                split = True
            add("I" if split else "B", s1)
            if i == (r + 1) // 2 and r % 2 == 0:
                split = True
            add("I" if split else "B", s0)
        for _ in range(p - r - 1):
            weight()
            add("I" if split else "B", s0)
        for _ in range(r + 1):
            weight()
        out.append(acts)
    return out


KINDS: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v",
                          "dualpipev")
V_KINDS: tuple[str, ...] = ("zb-v", "dualpipev")
SPLIT_KINDS: tuple[str, ...] = ("zb-h1", "zb-h2", "zb-v", "dualpipev")
"""Kinds whose backward runs (at least partly) as separate I and W actions."""

# Sizes the command line accepts. Building and timing cost about 4 microseconds per action
# and the action list as JSON about as much again, so 2^18 actions (twice issue 22's
# 64 x 512 x 2 interleaved case) answer in 1-3 s, 150-220 MB; beyond that nothing new is
# learnt (a bubble is (p - 1) / (m + p - 1) whatever m) while time and memory grow without
# bound. Real pipelines have tens of stages and hundreds of micro-batches: 256 and 4,096
# leave ample room.
MAX_STAGES = 256
MAX_MICROBATCHES = 4096
MAX_ACTIONS = 262_144


def action_count(kind: str, p: int, m: int, v: int) -> int:
    """Compute actions of ``kind`` on ``p`` ranks, ``m`` micro-batches and ``v`` chunks per
    rank, without building it: two per (chunk, micro-batch) (F, B), three when the backward
    is split (F, I, W; an upper bound for dualpipev, which splits only some)."""
    return p * v * m * (3 if kind in SPLIT_KINDS else 2)


def check_size(kind: str, p: int, m: int, v: int | None = None) -> int:
    """The action count of the schedule :func:`build` would make, checked first as
    :func:`build` checks it; SpecError naming the limit when ``p`` > MAX_STAGES, ``m`` >
    MAX_MICROBATCHES or the count > MAX_ACTIONS. Costs nothing: no schedule is built."""
    if v is None:
        v = default_virtual(kind)
    if p > MAX_STAGES:
        raise SpecError("stages", p, f"must be <= {MAX_STAGES}")
    if m > MAX_MICROBATCHES:
        raise SpecError("microbatches", m, f"must be <= {MAX_MICROBATCHES}")
    _check(kind, p, m, v)
    n = action_count(kind, p, m, v)
    if n > MAX_ACTIONS:
        per = 3 if kind in SPLIT_KINDS else 2
        what = (f"{kind} on {p} stages x {v} chunk(s) x {m} micro-batches x {per} would run "
                f"{n:,} actions; at most {MAX_ACTIONS:,}")
        fit = MAX_ACTIONS // (p * v * per)
        if fit == 0:
            raise SpecError("virtual", v, f"{what} (fewer chunks per rank)")
        raise SpecError("microbatches", m, f"{what} (fewer micro-batches: at most {fit:,})")
    return n


def default_virtual(kind: str) -> int:
    """Chunks per rank when none is given: 2 for interleaved and V schedules, else 1."""
    return 2 if kind in (*V_KINDS, "interleaved-1f1b") else 1


def _check(kind: str, p: int, m: int, v: int) -> None:
    if kind not in KINDS:
        raise SpecError("kind", kind, f"must be one of {', '.join(KINDS)}")
    require_positive_int("stages", p)
    require_positive_int("microbatches", m)
    require_positive_int("virtual", v)
    if kind in V_KINDS and v != 2:
        raise SpecError("virtual", v, f"must be 2 for {kind} (two chunks per rank in a V)")
    if kind == "interleaved-1f1b":
        if v < 2:
            raise SpecError("virtual", v, "must be >= 2 for interleaved-1f1b")
        if m % p:
            raise SpecError("microbatches", m, f"must be a multiple of stages ({p}) for "
                            "interleaved-1f1b (micro-batches run in groups of p)")
    elif kind not in V_KINDS and v != 1:
        raise SpecError("virtual", v, f"must be 1 for {kind}")
    if kind == "dualpipev" and m < 2 * p:
        raise SpecError("microbatches", m, f"must be >= 2*stages ({2 * p}) for dualpipev")


_BUILDERS: dict[str, Callable[[int, int, int], Ranks]] = {
    "gpipe": lambda p, m, v: gpipe(p, m),
    "1f1b": lambda p, m, v: one_f_one_b(p, m),
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": lambda p, m, v: zb_h1(p, m),
    "zb-h2": lambda p, m, v: zb_h2(p, m),
    "zb-v": lambda p, m, v: zb_v(p, m),
    "dualpipev": lambda p, m, v: dualpipev(p, m),
}


def build(kind: str, stages: int, microbatches: int, virtual: int | None = None) -> Schedule:
    """The schedule ``kind`` for ``stages`` ranks and ``microbatches``; ``virtual`` chunks
    per rank (default 2 for interleaved and V schedules, else 1). SpecError if not allowed."""
    if virtual is None:
        virtual = default_virtual(kind)
    _check(kind, stages, microbatches, virtual)
    placement = v_placement(stages) if kind in V_KINDS else loop_placement(stages, virtual)
    ranks = _BUILDERS[kind](stages, microbatches, virtual)
    return Schedule(kind, stages, microbatches, virtual, tuple(placement),
                    tuple(tuple(r) for r in ranks))
