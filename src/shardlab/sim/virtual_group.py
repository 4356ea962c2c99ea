"""A group of virtual devices in one process running collectives, with every byte counted.

A :class:`VirtualGroup` is a group of virtual devices named by global ids. Each
collective takes one tensor per member, in a list indexed by group position, and
returns a fresh tensor per member: devices share no memory, so no output aliases
an input or another output, and no input is changed.

The *result* is computed directly, one vectorised op in member order (for example
``torch.stack(xs).sum(0)``): running the algorithm step by step would cost O(p)
passes over the data. The *bytes* are those the named algorithm sends, derived from
the real chunk sizes in O(p) integer arithmetic (:mod:`shardlab.sim.algorithms`), and
recorded per global rank in a :class:`~shardlab.sim.ledger.Ledger`.
:func:`~shardlab.sim.ring_steps.ring_all_reduce_steps` runs the ring literally,
chunk by chunk, to check both.

Groups of one member move nothing and record nothing.

Wrong list lengths, shapes, dtypes or positions raise ``ValueError``: they are
programming errors in the calling simulation, not user input, so not SpecError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from shardlab.config.hardware import Link
from shardlab.sim.algorithms import (
    TrafficPlan,
    alpha_beta,
    chain_broadcast_plan,
    pairwise_exchange_plan,
    ring_all_reduce_plan,
    ring_pass,
    split_sizes,
    tree_all_reduce_plan,
    tree_broadcast_plan,
    tree_depth,
)
from shardlab.sim.ledger import Ledger

ALGORITHMS = ("ring", "tree")


# ---------------------------------------------------------------------------
# Validation (programming errors: ValueError)
# ---------------------------------------------------------------------------


def nbytes(x: Tensor) -> int:
    """Bytes ``x`` holds: its element count times its element size."""
    return x.numel() * x.element_size()


def check_tensors(xs: Sequence[object], op: str) -> None:
    """Every entry is a torch.Tensor."""
    for i, x in enumerate(xs):
        if not isinstance(x, Tensor):
            raise ValueError(f"{op}: member {i} gave {type(x).__name__}, not a torch.Tensor")


def check_alike(xs: Sequence[Tensor], op: str, *, from_dim: int = 0) -> None:
    """Same dtype and device, and the same shape from dimension ``from_dim`` on."""
    ref = xs[0]
    for i, x in enumerate(xs):
        if x.dtype != ref.dtype or x.device != ref.device:
            raise ValueError(f"{op}: member {i} has {x.dtype} on {x.device}, "
                             f"member 0 {ref.dtype} on {ref.device}; they must match")
        if x.dim() != ref.dim() or x.shape[from_dim:] != ref.shape[from_dim:]:
            what = "shape" if from_dim == 0 else f"shape after dim {from_dim - 1}"
            raise ValueError(f"{op}: member {i} has shape {tuple(x.shape)}, member 0 "
                             f"{tuple(ref.shape)}; the {what} must match")


def _check_has_rows(x: Tensor, op: str) -> None:
    if x.dim() == 0:
        raise ValueError(f"{op}: works along dim 0, so tensors need at least one dimension")


# ---------------------------------------------------------------------------
# The group
# ---------------------------------------------------------------------------


class VirtualGroup:
    """Members ``ranks`` (global device ids) that run collectives together.

    Every method takes and returns lists indexed by group position (position i is
    global rank ``ranks[i]``) and records into ``ledger`` under ``kind``. ``algorithm``
    ("ring" or "tree") chooses how all_reduce and broadcast are counted;
    reduce_scatter and all_gather are always ring, all_to_all pairwise exchange.
    """

    def __init__(self, ranks: list[int], ledger: Ledger, kind: str, link: Link | None = None,
                 algorithm: str = "ring") -> None:
        ranks = list(ranks)
        if not ranks:
            raise ValueError("VirtualGroup needs at least one member")
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
            raise ValueError(f"VirtualGroup ranks must be integers >= 0, got {ranks}")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"VirtualGroup ranks must be distinct, got {ranks}")
        if not isinstance(kind, str) or not kind or "/" in kind:
            raise ValueError(f"VirtualGroup kind must be a non-empty label without '/', "
                             f"got {kind!r}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"VirtualGroup algorithm must be one of {ALGORITHMS}, "
                             f"got {algorithm!r}")
        self.ranks = ranks
        self.ledger = ledger
        self.kind = kind
        self.link = link
        self.algorithm = algorithm

    @property
    def size(self) -> int:
        """Number of members, p."""
        return len(self.ranks)

    def __repr__(self) -> str:
        link = self.link.name if self.link else None
        return (f"VirtualGroup(ranks={self.ranks}, kind={self.kind!r}, link={link!r}, "
                f"algorithm={self.algorithm!r})")

    # -- helpers ------------------------------------------------------------

    def check_members(self, xs: Sequence[object], op: str) -> None:
        """Raise ValueError unless ``xs`` has one entry per member."""
        if len(xs) != self.size:
            raise ValueError(f"{op}: got {len(xs)} entries for a group of {self.size} "
                             f"members (one per member, in group order)")

    def _check_position(self, i: object, name: str, op: str) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.size:
            raise ValueError(f"{op}: {name}={i!r} is not a group position 0..{self.size - 1}")
        return i

    def _copies(self, x: Tensor) -> list[Tensor]:
        """x for member 0 and a clone for every other: one private buffer per device."""
        return [x] + [x.clone() for _ in range(self.size - 1)]

    def record(self, op: str, plan: TrafficPlan, seconds: float) -> None:
        """Record one call of ``op``: each member's share of ``plan``, and ``seconds``."""
        for i, rank in enumerate(self.ranks):
            self.ledger.record(rank, self.kind, op, sent=plan.sent[i], recv=plan.recv[i],
                               messages=plan.messages[i], seconds=seconds)

    @staticmethod
    def _sum(xs: Sequence[Tensor]) -> Tensor:
        """Sum in member order, one vectorised op, keeping the dtype (ints stay ints)."""
        return torch.stack(list(xs)).sum(0, dtype=xs[0].dtype)

    # -- collectives --------------------------------------------------------

    def all_reduce(self, xs: list[Tensor]) -> list[Tensor]:
        """Every member gets the sum of all members' tensors (same shape and dtype)."""
        op = "all_reduce"
        self.check_members(xs, op)
        check_tensors(xs, op)
        check_alike(xs, op)
        out = self._copies(self._sum(xs))
        p = self.size
        if p > 1:
            x = xs[0]
            if self.algorithm == "tree":
                n = nbytes(x)
                plan = tree_all_reduce_plan(n, p)
                seconds = 2 * alpha_beta(self.link, tree_depth(p), tree_depth(p) * n)
            else:
                sizes = [k * x.element_size() for k in split_sizes(x.numel(), p)]
                plan = ring_all_reduce_plan(sizes)
                seconds = alpha_beta(self.link, 2 * (p - 1), max(plan.sent))
            self.record(op, plan, seconds)
        return out

    def reduce_scatter(self, xs: list[Tensor]) -> list[Tensor]:
        """Member i gets the sum over members of chunk i of ``tensor_split(x, p, dim=0)``."""
        op = "reduce_scatter"
        self.check_members(xs, op)
        check_tensors(xs, op)
        check_alike(xs, op)
        _check_has_rows(xs[0], op)
        p = self.size
        out = [c.clone() for c in torch.tensor_split(self._sum(xs), p, dim=0)]
        if p > 1:
            x = xs[0]
            row_bytes = math.prod(x.shape[1:]) * x.element_size()
            plan = ring_pass([k * row_bytes for k in split_sizes(x.shape[0], p)], -1)
            self.record(op, plan, alpha_beta(self.link, p - 1, max(plan.sent)))
        return out

    def all_gather(self, xs: list[Tensor]) -> list[Tensor]:
        """Every member gets ``torch.cat(xs, dim=0)`` (members' dim-0 sizes may differ)."""
        op = "all_gather"
        self.check_members(xs, op)
        check_tensors(xs, op)
        _check_has_rows(xs[0], op)
        check_alike(xs, op, from_dim=1)
        out = self._copies(torch.cat(xs, dim=0))
        p = self.size
        if p > 1:
            plan = ring_pass([nbytes(x) for x in xs], 0)
            self.record(op, plan, alpha_beta(self.link, p - 1, max(plan.sent)))
        return out

    def broadcast(self, xs: list[Tensor | None], src: int) -> list[Tensor]:
        """Every member gets a copy of ``xs[src]``; other entries are receive buffers
        (None, or a tensor of the same shape and dtype, which is not written)."""
        op = "broadcast"
        self.check_members(xs, op)
        src = self._check_position(src, "src", op)
        if xs[src] is None:
            raise ValueError(f"broadcast: the source member {src} gave None")
        given = [x for x in xs if x is not None]
        check_tensors(given, op)
        check_alike([xs[src], *given], op)
        x = xs[src]
        p = self.size
        out = [x.clone() for _ in range(p)]
        if p > 1:
            n = nbytes(x)
            if self.algorithm == "tree":
                plan = tree_broadcast_plan(n, p, src)
                seconds = alpha_beta(self.link, tree_depth(p), tree_depth(p) * n)
            else:
                plan = chain_broadcast_plan(n, p, src)
                seconds = alpha_beta(self.link, p - 1, n)
            self.record(op, plan, seconds)
        return out

    def all_to_all(self, xs: list[list[Tensor]]) -> list[list[Tensor]]:
        """``xs[i][j]`` goes from member i to member j: out[j][i] is a copy of it.

        Blocks may differ in shape but share one dtype; a member's block to itself
        is copied locally and not counted.
        """
        op = "all_to_all"
        p = self.size
        self.check_members(xs, op)
        for i, row in enumerate(xs):
            if len(row) != p:
                raise ValueError(f"{op}: member {i} gave {len(row)} blocks for {p} members")
        flat = [x for row in xs for x in row]
        check_tensors(flat, op)
        dtype = flat[0].dtype
        if any(x.dtype != dtype for x in flat):
            raise ValueError(f"{op}: every block must have one dtype ({dtype} first)")
        out = [[xs[i][j].clone() for i in range(p)] for j in range(p)]
        if p > 1:
            plan = pairwise_exchange_plan([[nbytes(x) for x in row] for row in xs])
            self.record(op, plan, alpha_beta(self.link, p - 1, max(plan.sent)))
        return out

    def all_to_all_single(self, xs: list[Tensor], splits: list[list[int]]) -> list[Tensor]:
        """torch's ``all_to_all_single`` with uneven splits: member i sends rows
        ``splits[i][j]`` of its tensor, in order j = 0..p-1, to member j; member j gets
        ``torch.cat`` over i of the rows i sent it (in member order).

        Each ``xs[i]`` has ``sum(splits[i])`` rows; rows beyond dim 0 and the dtype are
        alike. Bytes as :meth:`all_to_all`: rows to every other member times the row's
        bytes; a member's rows to itself stay local and are not counted. The reverse
        exchange (what a combine, or the backward, runs) is the same call with the
        transposed splits, ``[[splits[j][i] for j] for i]``.
        """
        op = "all_to_all"
        p = self.size
        self.check_members(xs, op)
        self.check_members(splits, op)
        check_tensors(xs, op)
        _check_has_rows(xs[0], op)
        check_alike(xs, op, from_dim=1)
        for i, (x, row) in enumerate(zip(xs, splits, strict=True)):
            if (len(row) != p or any(isinstance(k, bool) or not isinstance(k, int) or k < 0
                                     for k in row)):
                raise ValueError(f"{op}: member {i} gave splits {row}; it needs {p} "
                                 "row counts >= 0")
            if sum(row) != x.shape[0]:
                raise ValueError(f"{op}: member {i}'s splits {row} sum to {sum(row)}, "
                                 f"its tensor has {x.shape[0]} rows")
        blocks = [list(x.split(row)) for x, row in zip(xs, splits, strict=True)]
        return [torch.cat(col) for col in self.all_to_all(blocks)]

    def send(self, x: Tensor, src: int, dst: int) -> Tensor:
        """Point-to-point: member ``src`` sends ``x`` to member ``dst``; returns dst's copy."""
        op = "send"
        src = self._check_position(src, "src", op)
        dst = self._check_position(dst, "dst", op)
        if src == dst:
            raise ValueError(f"send: src and dst are both member {src}")
        check_tensors([x], op)
        n = nbytes(x)
        seconds = alpha_beta(self.link, 1, n)
        self.ledger.record(self.ranks[src], self.kind, op, sent=n, messages=1, seconds=seconds)
        self.ledger.record(self.ranks[dst], self.kind, op, recv=n, seconds=seconds)
        return x.clone()
