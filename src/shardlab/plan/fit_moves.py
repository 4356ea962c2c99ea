"""The single changes of one knob that :mod:`shardlab.plan.fit` prices: the knobs a change
may touch (:class:`Knobs`), every one-knob change from a layout (:func:`moves`, the list of
the fit module's docstring) and those knobs as the planner's candidates
(:func:`knob_candidates`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from shardlab.config.layout import RECOMPUTE, SCHEDULES, Layout
from shardlab.plan.space import TRAIN_ZERO, Candidates

KINDS: tuple[str, ...] = ("zero", "recompute", "micro_batch", "tp", "pp", "sp", "ep", "cp")
REPEATABLE: frozenset[str] = frozenset({"micro_batch", "tp", "pp", "ep", "cp"})
"""Kinds a pair may apply twice (micro-batch / 4, tp x 4, pp x 4); a ZeRO stage or a
recompute mode is already tried at every level."""


@dataclass(frozen=True)
class Knobs:
    """The layout fields a change may touch (the rest, the job's, stay as given)."""

    dp: int
    tp: int
    pp: int
    virtual_stages: int
    schedule: str
    zero: int
    sp: bool
    recompute: str
    micro_batch: int
    ep: int = 1
    etp: int = 1
    cp: int = 1
    dp_replicate: int = 1
    stage_layers: tuple[int, ...] = ()

    def label(self, base: Knobs) -> str:
        """What differs from ``base``, as ``--layout`` writes it: ``tp=2 dp=4``."""
        keys = ("zero", "recompute", "micro_batch", "tp", "pp", "sp", "ep", "etp", "cp", "dp",
                "stage_layers")

        def text(k: str, v: object) -> str:
            if k == "sp":
                return str(int(v))  # type: ignore[call-overload]
            if k == "stage_layers":
                return "+".join(map(str, v))  # type: ignore[call-overload]
            return str(v)

        # etp is named only when it is not tp (its default), as Layout.describe does; an
        # even split (stage_layers left out) only as the key's absence.
        return " ".join(f"{k}={text(k, v)}" for k in keys
                        if (v := getattr(self, k)) != getattr(base, k)
                        and (k != "etp" or v != self.tp) and (k != "stage_layers" or v))


def moves(k: Knobs, gpus_per_node: int, train_only: bool, experts: int = 0, seq: int = 0,
          fold: bool = False) -> list[tuple[str, Knobs | None, str]]:
    """(kind, changed knobs or None, why not) of every one-knob change from ``k``; values
    that are no change (a ZeRO stage at or below the current one) are left out.
    ``experts``: the model's routed experts (0: dense, no ep change); ``seq``: the
    sequence length (0: no cp change)."""
    out: list[tuple[str, Knobs | None, str]] = []
    halve = ("" if k.dp % 2 == 0 and (k.dp // 2) % k.dp_replicate == 0 else
             f"dp={k.dp} cannot be halved to keep the device count" if k.dp % 2 else
             f"dp={k.dp // 2} would not hold dp_replicate={k.dp_replicate} replicas")
    for z in range(k.zero + 1, 4):
        if k.dp * k.cp == 1:
            out.append(("zero", None, "dp=1: ZeRO shards over data parallelism"))
            break
        if train_only and z not in TRAIN_ZERO:
            continue  # shardlab train has no ZeRO-1; the plan for this machine skips it too
        out.append(("zero", dataclasses.replace(k, zero=z), ""))
    for r in RECOMPUTE[RECOMPUTE.index(k.recompute) + 1:]:
        out.append(("recompute", dataclasses.replace(k, recompute=r), ""))
    if k.micro_batch > 1:
        out.append(("micro_batch", dataclasses.replace(k, micro_batch=k.micro_batch // 2), ""))
    else:
        out.append(("micro_batch", None, "micro_batch=1 cannot be halved"))
    if 2 * k.tp > gpus_per_node:
        out.append(("tp", None, f"tp={2 * k.tp} would leave a node of {gpus_per_node}"))
    elif halve:
        out.append(("tp", None, halve))
    else:
        out.append(("tp", dataclasses.replace(k, tp=2 * k.tp, dp=k.dp // 2,
                                              etp=2 * k.tp if k.etp == k.tp else 1), ""))
    if halve:
        out.append(("pp", None, halve))
    else:
        out.append(("pp", dataclasses.replace(k, pp=2 * k.pp, dp=k.dp // 2,
                                              stage_layers=()), ""))
    if not k.sp:
        out.append(("sp", dataclasses.replace(k, sp=True) if k.tp > 1 else None,
                    "" if k.tp > 1 else "sequence parallelism needs tp > 1"))
    if experts:
        e, ranks = 2 * k.ep, k.dp * (k.cp * k.tp // k.etp if fold else 1)  # expert mesh
        why = ("" if ranks % e == 0 and experts % e == 0 else
               f"ep={e} must divide {'tp*cp*dp/etp' if fold else 'dp'} ({ranks}) and the "
               f"experts ({experts})")
        out.append(("ep", None if why else dataclasses.replace(k, ep=e), why))
    if seq and not train_only:
        c = 2 * k.cp
        why = (halve or ("" if seq % (2 * c) == 0 else
                         f"cp={c} does not cut seq ({seq}) into 2*cp equal chunks"))
        out.append(("cp", None if why else dataclasses.replace(k, cp=c, dp=k.dp // 2), why))
    return out


def knob_candidates(states: list[Knobs], global_batch: int, capacity_factor: float = 0.0,
                    fold: bool = False) -> Candidates:
    """``states`` as the planner's :class:`Candidates` (reason -1: checked afterwards)."""
    def col(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    splits = tuple(dict.fromkeys([(), *(s.stage_layers for s in states)]))
    return Candidates(col([s.dp for s in states]), col([s.tp for s in states]),
                      col([s.pp for s in states]), col([s.virtual_stages for s in states]),
                      col([SCHEDULES.index(s.schedule) for s in states]),
                      col([s.zero for s in states]), np.array([s.sp for s in states], bool),
                      col([RECOMPUTE.index(s.recompute) for s in states]),
                      col([s.micro_batch for s in states]),
                      col([global_batch // (s.dp * s.micro_batch) for s in states]),
                      np.full(len(states), -1, dtype=np.int64), col([s.ep for s in states]),
                      col([s.etp for s in states]), np.full(len(states), capacity_factor),
                      col([s.cp for s in states]), col([s.dp_replicate for s in states]),
                      col([splits.index(s.stage_layers) for s in states]), splits, fold)


def knobs_of(lay: Layout) -> Knobs:
    """``lay``'s knobs."""
    return Knobs(lay.dp, lay.tp, lay.pp, lay.virtual_stages, lay.schedule, lay.zero, lay.sp,
                 lay.recompute, lay.micro_batch, lay.ep, lay.etp, lay.cp, lay.dp_replicate,
                 lay.stage_layers)


def would_be(kind: str, base: Knobs) -> str:
    """How a change that was ruled out before it had values is named in ``skipped``."""
    return {"zero": f"zero={base.zero + 1}..3", "micro_batch": "halve micro_batch",
            "tp": f"tp={2 * base.tp}", "pp": f"pp={2 * base.pp}", "sp": "sp=1",
            "ep": f"ep={2 * base.ep}", "cp": f"cp={2 * base.cp}"}[kind]
