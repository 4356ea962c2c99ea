"""The counted communication: bytes, messages, calls and seconds of every global rank.

Each collective records, per global rank that took part, the bytes it sent and
received, the messages it sent, one call and the call's alpha-beta seconds, under the
caller's kind ("dp", "tp", ...) and the collective's name ("all_reduce", ...). Bytes
are element counts times the element size; seconds are those of
:func:`shardlab.sim.algorithms.alpha_beta`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict


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
