"""The vocabulary of a pipeline schedule: actions, stage placement, and the schedule itself.

A schedule is, for each pipeline rank, the ordered list of compute actions it runs.
An action is (kind, stage, microbatch), with the kinds torch.distributed.pipelining
uses (``torch/distributed/pipelining/schedules.py``):

* ``F`` forward of one micro-batch through one stage (model chunk);
* ``B`` full backward (input and weight gradients together);
* ``I`` backward for the input gradient only (the zero-bubble papers call it B);
* ``W`` backward for the weight gradient only.

A model of ``pp * v`` stages is placed on ``pp`` ranks either in a loop (stage s on
rank s mod pp: interleaved 1F1B, Narayanan et al. 2021) or in a V (stage s on
rank s for s < pp, else on 2pp - 1 - s: ZB-V and DualPipeV, so the first and last
stage share rank 0). Sends and receives are not listed: they follow from the
placement (a forward output goes from stage s to s+1, its gradient back), see
:meth:`Schedule.messages`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, repeat
from operator import itemgetter
from typing import NamedTuple

import numpy as np

KINDS_OF_ACTION = ("F", "B", "I", "W")
_CODE = {k: i for i, k in enumerate(KINDS_OF_ACTION)}


class Action(NamedTuple):
    """One compute action: kind F/B/I/W, stage (model chunk index), micro-batch."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        # torch's notation: stage, kind, micro-batch (e.g. "2F0").
        return f"{self.stage}{self.kind}{self.microbatch}"


def loop_placement(pp: int, v: int) -> list[int]:
    """Rank of each of the pp*v stages when they wrap around the ranks v times."""
    return [s % pp for s in range(pp * v)]


def v_placement(pp: int) -> list[int]:
    """Rank of each of the 2*pp stages in a V: down the ranks and back up."""
    return [s if s < pp else 2 * pp - 1 - s for s in range(2 * pp)]


class Columns(NamedTuple):
    """A schedule's actions as flat arrays, rank 0's first, each rank's in its own order:
    what the simulator and the writers work on (a walk over 131,072 Action objects in
    Python takes tenths of a second, a numpy pass over these arrays a millisecond)."""

    rank: np.ndarray  # int64, the rank that runs the action
    kind: np.ndarray  # int64 index into KINDS_OF_ACTION; -1 for a kind it does not hold
    stage: np.ndarray  # int64
    microbatch: np.ndarray  # int64
    offsets: np.ndarray  # int64, pp + 1 of them: rank r's actions are [offsets[r], offsets[r+1])


class Message(NamedTuple):
    """A point-to-point transfer implied by the placement: activation or gradient."""

    kind: str  # "activation" (forward) or "gradient" (backward)
    src_rank: int
    dst_rank: int
    stage: int  # the stage whose output is sent
    microbatch: int


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered compute actions of a pipeline schedule."""

    name: str
    pp: int
    microbatches: int
    virtual_stages: int
    placement: tuple[int, ...]  # stage -> rank
    ranks: tuple[tuple[Action, ...], ...]

    @property
    def stages(self) -> int:
        """Model chunks in the pipeline: pp * virtual_stages."""
        return len(self.placement)

    @cached_property
    def chunk_of_stage(self) -> tuple[int, ...]:
        """For each stage, its model-chunk index on its own rank (0 .. v-1, in stage order)."""
        seen = [0] * self.pp
        out = []
        for rank in self.placement:
            out.append(seen[rank])
            seen[rank] += 1
        return tuple(out)

    @property
    def splits_backward(self) -> bool:
        """Whether backward runs as separate I and W actions anywhere."""
        return any(a.kind == "W" for actions in self.ranks for a in actions)

    @property
    def num_actions(self) -> int:
        """Compute actions over all ranks."""
        return sum(len(r) for r in self.ranks)

    @cached_property
    def columns(self) -> Columns:
        """The actions as flat arrays (:class:`Columns`), built once."""
        flat = list(chain.from_iterable(self.ranks))
        n = len(flat)

        def column(values: Iterable[int]) -> np.ndarray:
            # fromiter over map, not zip(*flat): transposing 131,072 tuples that way took 4x
            return np.fromiter(values, dtype=np.int64, count=n)

        lengths = [len(actions) for actions in self.ranks]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return Columns(np.repeat(np.arange(len(lengths), dtype=np.int64), lengths),
                       column(map(_CODE.get, map(itemgetter(0), flat), repeat(-1))),
                       column(map(itemgetter(1), flat)), column(map(itemgetter(2), flat)),
                       offsets)

    @property
    def num_messages(self) -> int:
        """``len(self.messages())`` of a valid schedule (one whose stages are in range),
        counted on :attr:`columns` without building the messages."""
        c, place = self.columns, np.asarray(self.placement, dtype=np.int64)
        last = self.stages - 1
        sends = (c.kind == _CODE["F"]) & (c.stage < last)
        grads = ((c.kind == _CODE["B"]) | (c.kind == _CODE["I"])) & (c.stage > 0)
        own = place[c.stage]
        return int(np.count_nonzero(sends & (own != place[np.minimum(c.stage + 1, last)]))
                   + np.count_nonzero(grads & (own != place[np.maximum(c.stage - 1, 0)])))

    def messages(self) -> list[Message]:
        """Every send between different ranks: each forward's output to the next stage, each
        backward's input gradient to the previous stage (same-rank hand-overs are not sent)."""
        out = []
        last = self.stages - 1
        for actions in self.ranks:
            for a in actions:
                if a.kind == "F" and a.stage < last:
                    src, dst = self.placement[a.stage], self.placement[a.stage + 1]
                    if src != dst:
                        out.append(Message("activation", src, dst, a.stage, a.microbatch))
                elif a.kind in ("B", "I") and a.stage > 0:
                    src, dst = self.placement[a.stage], self.placement[a.stage - 1]
                    if src != dst:
                        out.append(Message("gradient", src, dst, a.stage, a.microbatch))
        return out
