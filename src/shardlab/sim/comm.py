"""Collectives over K virtual devices in one process, with every byte counted.

A :class:`VirtualGroup` is a group of virtual devices named by global ids. Each
collective takes one tensor per member, in a list indexed by group position, and
returns a fresh tensor per member: devices share no memory, so no output aliases
an input or another output, and no input is changed.

The *result* is computed directly, one vectorised op in member order (for example
``torch.stack(xs).sum(0)``): running the algorithm step by step would cost O(p)
passes over the data. The *bytes* are those the named algorithm sends, derived from
the real chunk sizes in O(p) integer arithmetic, and recorded per global rank in a
:class:`Ledger`. :func:`ring_all_reduce_steps` runs the ring literally, chunk by
chunk, to check both.

Algorithms, for p members and an n-byte buffer; bytes are element counts times the
element size; alpha is a link's latency (s), bandwidth its one-direction rate
(bytes/s). Sources: Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective
Communication Operations in MPICH" (ring, binomial-tree and pairwise-exchange
algorithms and their alpha-beta costs); Patarasuk & Yuan 2009, "Bandwidth optimal
all-reduce algorithms for clusters of workstations" (the ring all-reduce moves the
least data any all-reduce can).

* Ring reduce-scatter / all-gather: p-1 steps, one chunk to the right neighbour per
  step; a member sends every chunk but one, (p-1)/p·n bytes when p divides n.
  Time (p-1)·alpha + busiest/bandwidth.
* Ring all-reduce: ring reduce-scatter then ring all-gather over the
  ``torch.tensor_split`` chunks c_0..c_{p-1} of the flattened buffer. Member r sends
  2n - c_{(r+1) mod p} - c_{(r+2) mod p} bytes in 2(p-1) messages: exactly
  2(p-1)/p·n when p divides n. Time 2(p-1)·alpha + busiest/bandwidth.
* Tree all-reduce (``algorithm="tree"``): binomial-tree reduce to member 0, then
  binomial-tree broadcast from it; every member but the root sends n once upward,
  and every member sends n to each of its children downward. Time
  2·ceil(log2 p)·(alpha + n/bandwidth).
* Broadcast: ``"ring"`` is a pipelined chain src -> src+1 -> ... (every member but
  the last sends n once), time (p-1)·alpha + n/bandwidth (the pipeline fills once,
  then streams at one link's rate); ``"tree"`` a binomial tree rooted at src, time
  ceil(log2 p)·(alpha + n/bandwidth).
* All-to-all: pairwise exchange, p-1 messages per member (blocks to itself are
  not sent). Time (p-1)·alpha + busiest/bandwidth.
* Send: one message, alpha + n/bandwidth.

A message is one send by one member. An empty chunk (a buffer of fewer than p
elements) still counts as a message: the ring step, and its latency, happen anyway.
Groups of one member move nothing and record nothing. Without a link the seconds
are 0.

Wrong list lengths, shapes, dtypes or positions raise ``ValueError``: they are
programming errors in the calling simulation, not user input, so not SpecError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypedDict

import torch
from torch import Tensor

from shardlab.config.hardware import Link

ALGORITHMS = ("ring", "tree")


# ---------------------------------------------------------------------------
# The ledger: bytes, messages, calls and seconds per global rank
# ---------------------------------------------------------------------------


class KindStats(TypedDict):
    """Totals of one kind (or one kind and op): bytes sent and received, sends, calls, s."""

    sent: int
    recv: int
    messages: int
    calls: int
    seconds: float


def _empty_stats() -> KindStats:
    return {"sent": 0, "recv": 0, "messages": 0, "calls": 0, "seconds": 0.0}


def _op_key(kind: str, op: str) -> str:
    return f"{kind}/{op}"


@dataclass
class Traffic:
    """What one global rank moved: bytes sent and received, messages it sent, seconds.

    ``by_kind`` breaks the totals down by the caller's label ("dp", "tp", ...);
    ``by_op`` by label and collective, keyed ``"kind/op"`` (e.g. ``"dp/all_reduce"``).
    """

    bytes_sent: int = 0
    bytes_recv: int = 0
    messages: int = 0
    seconds: float = 0.0
    by_kind: dict[str, KindStats] = field(default_factory=dict)
    by_op: dict[str, KindStats] = field(default_factory=dict)

    def add(self, kind: str, op: str, *, sent: int, recv: int, messages: int,
            seconds: float, calls: int) -> None:
        """Add one call's share to the totals and to its kind and op."""
        self.bytes_sent += sent
        self.bytes_recv += recv
        self.messages += messages
        self.seconds += seconds
        for table, key in ((self.by_kind, kind), (self.by_op, _op_key(kind, op))):
            stats = table.get(key)
            if stats is None:  # not setdefault: that would build a dict on every call
                stats = table[key] = _empty_stats()
            stats["sent"] += sent
            stats["recv"] += recv
            stats["messages"] += messages
            stats["calls"] += calls
            stats["seconds"] += seconds

    def as_dict(self) -> dict:
        """Plain dicts, ints and floats only (a copy: later records do not change it)."""
        return {
            "sent": self.bytes_sent,
            "recv": self.bytes_recv,
            "messages": self.messages,
            "seconds": self.seconds,
            "by_kind": {k: dict(v) for k, v in self.by_kind.items()},
            "by_op": {k: dict(v) for k, v in self.by_op.items()},
        }


class Ledger:
    """Traffic of every global rank, shared by all the groups of one simulation.

    ``world_size`` lists ranks 0..world_size-1 from the start (so a rank that never
    communicates still shows zeros); any other rank appears on its first record.
    """

    def __init__(self, world_size: int = 0) -> None:
        self._traffic: dict[int, Traffic] = {r: Traffic() for r in range(world_size)}

    @property
    def ranks(self) -> list[int]:
        """Global ranks the ledger holds, ascending."""
        return sorted(self._traffic)

    def traffic(self, rank: int) -> Traffic:
        """The Traffic of ``rank`` (an empty one, not stored, if it never communicated)."""
        return self._traffic.get(rank, Traffic())

    def record(self, rank: int, kind: str, op: str, *, sent: int = 0, recv: int = 0,
               messages: int = 0, seconds: float = 0.0, calls: int = 1) -> None:
        """Add what ``rank`` sent and received (bytes) in ``calls`` calls of ``op``."""
        if min(sent, recv, messages, calls) < 0 or seconds < 0:
            raise ValueError(f"record({rank}, {kind!r}, {op!r}): counts must be >= 0")
        self._traffic.setdefault(rank, Traffic()).add(
            kind, op, sent=sent, recv=recv, messages=messages, seconds=seconds, calls=calls)

    def reset(self) -> None:
        """Zero every count; the ranks stay listed."""
        self._traffic = {r: Traffic() for r in self._traffic}

    def snapshot(self) -> dict[str, dict]:
        """JSON-ready copy: ``{str(rank): {sent, recv, messages, seconds, by_kind, by_op}}``.

        Rank keys are strings so that ``json.loads(json.dumps(s)) == s``.
        """
        return {str(r): self._traffic[r].as_dict() for r in self.ranks}

    def _stat(self, rank: int, name: str, kind: str | None, op: str | None) -> float:
        t = self.traffic(rank)
        if kind is None and op is None:
            return {"sent": t.bytes_sent, "recv": t.bytes_recv, "messages": t.messages,
                    "seconds": t.seconds}[name]
        if op is None:
            return t.by_kind.get(kind, _empty_stats())[name]
        if kind is not None:
            return t.by_op.get(_op_key(kind, op), _empty_stats())[name]
        # An op across every kind.
        return sum(v[name] for k, v in t.by_op.items() if k.split("/", 1)[1] == op)

    def sent(self, rank: int, kind: str | None = None, op: str | None = None) -> int:
        """Bytes ``rank`` sent, in all, of one kind, of one op, or of one kind and op."""
        return int(self._stat(rank, "sent", kind, op))

    def recv(self, rank: int, kind: str | None = None, op: str | None = None) -> int:
        """Bytes ``rank`` received (same filters as :meth:`sent`)."""
        return int(self._stat(rank, "recv", kind, op))

    def messages(self, rank: int, kind: str | None = None, op: str | None = None) -> int:
        """Messages ``rank`` sent (same filters as :meth:`sent`)."""
        return int(self._stat(rank, "messages", kind, op))

    def seconds(self, rank: int, kind: str | None = None, op: str | None = None) -> float:
        """Alpha-beta seconds of the calls ``rank`` took part in (same filters)."""
        return float(self._stat(rank, "seconds", kind, op))


# ---------------------------------------------------------------------------
# Byte plans: what each member of a group sends and receives, O(p) arithmetic
# ---------------------------------------------------------------------------


class _Plan(NamedTuple):
    """Per group position: bytes sent, bytes received, messages sent."""

    sent: list[int]
    recv: list[int]
    messages: list[int]


def _split_sizes(n: int, p: int) -> list[int]:
    """Sizes of ``torch.tensor_split`` of n items into p parts: the first n mod p get one more."""
    q, extra = divmod(n, p)
    return [q + (i < extra) for i in range(p)]


def _ring_pass(chunk_bytes: list[int], offset: int) -> _Plan:
    """p-1 ring steps in which member r sends chunk (r + offset - s) mod p at step s.

    Over the steps r sends every chunk but (r + offset + 1) mod p (the one it would
    send at step p-1), and receives from r-1 every chunk but (r + offset) mod p.
    Offsets: -1 for a reduce-scatter that leaves chunk r on member r; 0 for an
    all-gather starting from chunk r on member r, and for the reduce-scatter phase
    of all-reduce (which leaves chunk r+1 on member r); 1 for all-reduce's
    all-gather phase.
    """
    p, total = len(chunk_bytes), sum(chunk_bytes)
    sent = [total - chunk_bytes[(r + offset + 1) % p] for r in range(p)]
    recv = [total - chunk_bytes[(r + offset) % p] for r in range(p)]
    return _Plan(sent, recv, [p - 1] * p)


def _ring_all_reduce_plan(chunk_bytes: list[int]) -> _Plan:
    """Ring reduce-scatter (offset 0) then ring all-gather (offset 1), summed per member."""
    a, b = _ring_pass(chunk_bytes, 0), _ring_pass(chunk_bytes, 1)
    return _Plan(*([x + y for x, y in zip(u, v, strict=True)] for u, v in zip(a, b, strict=True)))


def _tree_depth(p: int) -> int:
    """ceil(log2 p): rounds of a binomial tree on p members."""
    return (p - 1).bit_length()


def _binomial_children(v: int, p: int) -> int:
    """Children of virtual rank v (root 0) in a binomial tree: v + 2^k for 2^k below v's
    lowest set bit (any 2^k < p for the root), kept while < p."""
    limit = v & -v if v else 1 << _tree_depth(p)
    count, step = 0, 1
    while step < limit and v + step < p:
        count += 1
        step <<= 1
    return count


def _tree_broadcast_plan(nbytes: int, p: int, src: int) -> _Plan:
    """Binomial-tree broadcast from ``src``: n to each child, n received by each non-root."""
    sent, recv, msgs = [], [], []
    for r in range(p):
        v = (r - src) % p
        kids = _binomial_children(v, p)
        sent.append(kids * nbytes)
        recv.append(nbytes if v else 0)
        msgs.append(kids)
    return _Plan(sent, recv, msgs)


def _tree_all_reduce_plan(nbytes: int, p: int) -> _Plan:
    """Binomial reduce to member 0 (the broadcast's mirror: each non-root sends n once
    to its parent) then binomial broadcast from member 0."""
    down = _tree_broadcast_plan(nbytes, p, 0)
    # The reduce runs the broadcast's edges backwards: what a member sent down it
    # receives up, and what it received down it sends up.
    return _Plan([s + r for s, r in zip(down.sent, down.recv, strict=True)],
                 [s + r for s, r in zip(down.sent, down.recv, strict=True)],
                 [m + (r > 0) for r, m in enumerate(down.messages)])


def _chain_broadcast_plan(nbytes: int, p: int, src: int) -> _Plan:
    """Pipelined chain src -> src+1 -> ... -> src+p-1 (mod p): all but the last send n."""
    sent, recv, msgs = [], [], []
    for r in range(p):
        v = (r - src) % p
        sent.append(nbytes if v < p - 1 else 0)
        recv.append(nbytes if v > 0 else 0)
        msgs.append(int(v < p - 1))
    return _Plan(sent, recv, msgs)


def _alpha_beta(link: Link | None, messages: int, nbytes: float) -> float:
    """messages·alpha + nbytes/bandwidth in s (0 without a link)."""
    if link is None:
        return 0.0
    return messages * link.latency + nbytes / link.bandwidth


# ---------------------------------------------------------------------------
# Validation (programming errors: ValueError)
# ---------------------------------------------------------------------------


def _nbytes(x: Tensor) -> int:
    return x.numel() * x.element_size()


def _check_tensors(xs: Sequence[object], op: str) -> None:
    for i, x in enumerate(xs):
        if not isinstance(x, Tensor):
            raise ValueError(f"{op}: member {i} gave {type(x).__name__}, not a torch.Tensor")


def _check_alike(xs: Sequence[Tensor], op: str, *, from_dim: int = 0) -> None:
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

    def _check_members(self, xs: Sequence[object], op: str) -> None:
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

    def _record(self, op: str, plan: _Plan, seconds: float) -> None:
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
        self._check_members(xs, op)
        _check_tensors(xs, op)
        _check_alike(xs, op)
        out = self._copies(self._sum(xs))
        p = self.size
        if p > 1:
            x = xs[0]
            if self.algorithm == "tree":
                n = _nbytes(x)
                plan = _tree_all_reduce_plan(n, p)
                seconds = 2 * _alpha_beta(self.link, _tree_depth(p), _tree_depth(p) * n)
            else:
                sizes = [k * x.element_size() for k in _split_sizes(x.numel(), p)]
                plan = _ring_all_reduce_plan(sizes)
                seconds = _alpha_beta(self.link, 2 * (p - 1), max(plan.sent))
            self._record(op, plan, seconds)
        return out

    def reduce_scatter(self, xs: list[Tensor]) -> list[Tensor]:
        """Member i gets the sum over members of chunk i of ``tensor_split(x, p, dim=0)``."""
        op = "reduce_scatter"
        self._check_members(xs, op)
        _check_tensors(xs, op)
        _check_alike(xs, op)
        _check_has_rows(xs[0], op)
        p = self.size
        out = [c.clone() for c in torch.tensor_split(self._sum(xs), p, dim=0)]
        if p > 1:
            x = xs[0]
            row_bytes = math.prod(x.shape[1:]) * x.element_size()
            plan = _ring_pass([k * row_bytes for k in _split_sizes(x.shape[0], p)], -1)
            self._record(op, plan, _alpha_beta(self.link, p - 1, max(plan.sent)))
        return out

    def all_gather(self, xs: list[Tensor]) -> list[Tensor]:
        """Every member gets ``torch.cat(xs, dim=0)`` (members' dim-0 sizes may differ)."""
        op = "all_gather"
        self._check_members(xs, op)
        _check_tensors(xs, op)
        _check_has_rows(xs[0], op)
        _check_alike(xs, op, from_dim=1)
        out = self._copies(torch.cat(xs, dim=0))
        p = self.size
        if p > 1:
            plan = _ring_pass([_nbytes(x) for x in xs], 0)
            self._record(op, plan, _alpha_beta(self.link, p - 1, max(plan.sent)))
        return out

    def broadcast(self, xs: list[Tensor | None], src: int) -> list[Tensor]:
        """Every member gets a copy of ``xs[src]``; other entries are receive buffers
        (None, or a tensor of the same shape and dtype, which is not written)."""
        op = "broadcast"
        self._check_members(xs, op)
        src = self._check_position(src, "src", op)
        if xs[src] is None:
            raise ValueError(f"broadcast: the source member {src} gave None")
        given = [x for x in xs if x is not None]
        _check_tensors(given, op)
        _check_alike([xs[src], *given], op)
        x = xs[src]
        p = self.size
        out = [x.clone() for _ in range(p)]
        if p > 1:
            n = _nbytes(x)
            if self.algorithm == "tree":
                plan = _tree_broadcast_plan(n, p, src)
                seconds = _alpha_beta(self.link, _tree_depth(p), _tree_depth(p) * n)
            else:
                plan = _chain_broadcast_plan(n, p, src)
                seconds = _alpha_beta(self.link, p - 1, n)
            self._record(op, plan, seconds)
        return out

    def all_to_all(self, xs: list[list[Tensor]]) -> list[list[Tensor]]:
        """``xs[i][j]`` goes from member i to member j: out[j][i] is a copy of it.

        Blocks may differ in shape but share one dtype; a member's block to itself
        is copied locally and not counted.
        """
        op = "all_to_all"
        p = self.size
        self._check_members(xs, op)
        for i, row in enumerate(xs):
            if len(row) != p:
                raise ValueError(f"{op}: member {i} gave {len(row)} blocks for {p} members")
        flat = [x for row in xs for x in row]
        _check_tensors(flat, op)
        dtype = flat[0].dtype
        if any(x.dtype != dtype for x in flat):
            raise ValueError(f"{op}: every block must have one dtype ({dtype} first)")
        out = [[xs[i][j].clone() for i in range(p)] for j in range(p)]
        if p > 1:
            sizes = [[_nbytes(x) for x in row] for row in xs]
            sent = [sum(sizes[i]) - sizes[i][i] for i in range(p)]
            recv = [sum(sizes[i][j] for i in range(p)) - sizes[j][j] for j in range(p)]
            plan = _Plan(sent, recv, [p - 1] * p)
            self._record(op, plan, _alpha_beta(self.link, p - 1, max(sent)))
        return out

    def send(self, x: Tensor, src: int, dst: int) -> Tensor:
        """Point-to-point: member ``src`` sends ``x`` to member ``dst``; returns dst's copy."""
        op = "send"
        src = self._check_position(src, "src", op)
        dst = self._check_position(dst, "dst", op)
        if src == dst:
            raise ValueError(f"send: src and dst are both member {src}")
        _check_tensors([x], op)
        n = _nbytes(x)
        seconds = _alpha_beta(self.link, 1, n)
        self.ledger.record(self.ranks[src], self.kind, op, sent=n, messages=1, seconds=seconds)
        self.ledger.record(self.ranks[dst], self.kind, op, recv=n, seconds=seconds)
        return x.clone()


# ---------------------------------------------------------------------------
# The ring, literally
# ---------------------------------------------------------------------------


def ring_all_reduce_steps(xs: list[Tensor], group: VirtualGroup | None = None) -> list[Tensor]:
    """Ring all-reduce run step by step, for teaching and for checking VirtualGroup.

    Each member keeps its own copy of its flattened tensor as p chunks
    (``tensor_split``). Reduce-scatter phase, steps s = 0..p-2: member r sends chunk
    (r - s) mod p to member r+1, which adds it to its own; afterwards member r holds
    the full sum of chunk (r+1) mod p. All-gather phase, steps s = 0..p-2: member r
    sends chunk (r + 1 - s) mod p to r+1, which keeps it. Each member sends 2(p-1)
    chunks (Patarasuk & Yuan 2009). The sums are accumulated in ring order, so in
    floating point they may differ from the direct sum in the last bits.

    With ``group`` (same size as ``xs``), the bytes of every chunk actually moved are
    recorded as one ``all_reduce`` call with the ring's alpha-beta time, whatever the
    group's algorithm: the same entries ``group.all_reduce`` makes for a ring.
    """
    op = "all_reduce"
    p = len(xs)
    if p == 0:
        raise ValueError("ring_all_reduce_steps: needs at least one tensor")
    if group is not None:
        group._check_members(xs, op)
    _check_tensors(xs, op)
    _check_alike(xs, op)
    shape = xs[0].shape
    chunks = [list(torch.tensor_split(x.flatten().clone(), p)) for x in xs]
    sent, recv, msgs = [0] * p, [0] * p, [0] * p

    def step(owned: int, reduce: bool) -> None:
        # Every member sends at once: take all outgoing chunks before any lands.
        outgoing = [(r, (r + owned) % p, chunks[r][(r + owned) % p].clone()) for r in range(p)]
        for r, c, data in outgoing:
            dst = (r + 1) % p
            chunks[dst][c] = chunks[dst][c] + data if reduce else data
            sent[r] += _nbytes(data)
            recv[dst] += _nbytes(data)
            msgs[r] += 1

    for s in range(p - 1):
        step(-s, reduce=True)
    for s in range(p - 1):
        step(1 - s, reduce=False)
    out = [torch.cat(c).view(shape) for c in chunks]
    if group is not None and p > 1:
        group._record(op, _Plan(sent, recv, msgs), _alpha_beta(group.link, 2 * (p - 1),
                                                               max(sent)))
    return out
