"""Each collective algorithm's traffic: what every member sends and receives, and the seconds.

The bytes are those the named algorithm sends, derived from the real chunk sizes in
O(p) integer arithmetic (running the algorithm step by step would cost O(p) passes
over the data); :func:`alpha_beta` turns the busiest member's bytes and the messages
in sequence into seconds.

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
* All-to-all: pairwise exchange (Thakur et al. 2005, MPICH's algorithm for long
  messages: at step k = 1..p-1 member r sends its block for r+k and receives the
  block of r-k; time (p-1)·alpha + (p-1)/p·n/bandwidth for equal blocks), p-1 messages per
  member; a member's block to itself is copied locally, not sent. With uneven blocks
  (``all_to_all_single``'s splits) member i sends sum over j != i of b_ij bytes.
  Time (p-1)·alpha + busiest/bandwidth.
* Send: one message, alpha + n/bandwidth.

A message is one send by one member. An empty chunk (a buffer of fewer than p
elements) still counts as a message: the ring step, and its latency, happen anyway.
Without a link the seconds are 0.

The cost model gives the same per-member ring bytes without torch
(:func:`shardlab.estimate.comm.ring_allreduce_sent`, ``ring_reduce_scatter_sent``,
``ring_all_gather_sent``), written apart from these so that ``shardlab simulate``'s
check compares two derivations; ``tests/sim/test_virtual_group.py`` holds both to the
literal ring of :mod:`shardlab.sim.ring_steps`.
"""

from __future__ import annotations

from typing import NamedTuple

from shardlab.config.hardware import Link


class TrafficPlan(NamedTuple):
    """Per group position: bytes sent, bytes received, messages sent."""

    sent: list[int]
    recv: list[int]
    messages: list[int]


def split_sizes(n: int, p: int) -> list[int]:
    """Sizes of ``torch.tensor_split`` of n items into p parts: the first n mod p get one more."""
    q, extra = divmod(n, p)
    return [q + (i < extra) for i in range(p)]


def ring_pass(chunk_bytes: list[int], offset: int) -> TrafficPlan:
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
    return TrafficPlan(sent, recv, [p - 1] * p)


def ring_all_reduce_plan(chunk_bytes: list[int]) -> TrafficPlan:
    """Ring reduce-scatter (offset 0) then ring all-gather (offset 1), summed per member."""
    a, b = ring_pass(chunk_bytes, 0), ring_pass(chunk_bytes, 1)
    return TrafficPlan(*([x + y for x, y in zip(u, v, strict=True)]
                         for u, v in zip(a, b, strict=True)))


def tree_depth(p: int) -> int:
    """ceil(log2 p): rounds of a binomial tree on p members."""
    return (p - 1).bit_length()


def binomial_children(v: int, p: int) -> int:
    """Children of virtual rank v (root 0) in a binomial tree: v + 2^k for 2^k below v's
    lowest set bit (any 2^k < p for the root), kept while < p."""
    limit = v & -v if v else 1 << tree_depth(p)
    count, step = 0, 1
    while step < limit and v + step < p:
        count += 1
        step <<= 1
    return count


def tree_broadcast_plan(nbytes: int, p: int, src: int) -> TrafficPlan:
    """Binomial-tree broadcast from ``src``: n to each child, n received by each non-root."""
    sent, recv, msgs = [], [], []
    for r in range(p):
        v = (r - src) % p
        kids = binomial_children(v, p)
        sent.append(kids * nbytes)
        recv.append(nbytes if v else 0)
        msgs.append(kids)
    return TrafficPlan(sent, recv, msgs)


def tree_all_reduce_plan(nbytes: int, p: int) -> TrafficPlan:
    """Binomial reduce to member 0 (the broadcast's mirror: each non-root sends n once
    to its parent) then binomial broadcast from member 0."""
    down = tree_broadcast_plan(nbytes, p, 0)
    # The reduce runs the broadcast's edges backwards: what a member sent down it
    # receives up, and what it received down it sends up.
    return TrafficPlan([s + r for s, r in zip(down.sent, down.recv, strict=True)],
                       [s + r for s, r in zip(down.sent, down.recv, strict=True)],
                       [m + (r > 0) for r, m in enumerate(down.messages)])


def chain_broadcast_plan(nbytes: int, p: int, src: int) -> TrafficPlan:
    """Pipelined chain src -> src+1 -> ... -> src+p-1 (mod p): all but the last send n."""
    sent, recv, msgs = [], [], []
    for r in range(p):
        v = (r - src) % p
        sent.append(nbytes if v < p - 1 else 0)
        recv.append(nbytes if v > 0 else 0)
        msgs.append(int(v < p - 1))
    return TrafficPlan(sent, recv, msgs)


def pairwise_exchange_plan(block_bytes: list[list[int]]) -> TrafficPlan:
    """All-to-all by pairwise exchange: ``block_bytes[i][j]`` bytes go from member i to
    member j. Member i sends every block but its own, receives every block addressed to
    it but its own, in p-1 messages (an empty block still takes its step)."""
    p = len(block_bytes)
    sent = [sum(block_bytes[i]) - block_bytes[i][i] for i in range(p)]
    recv = [sum(block_bytes[i][j] for i in range(p)) - block_bytes[j][j] for j in range(p)]
    return TrafficPlan(sent, recv, [p - 1] * p)


def alpha_beta(link: Link | None, messages: int, nbytes: float) -> float:
    """messages·alpha + nbytes/bandwidth in s (0 without a link)."""
    if link is None:
        return 0.0
    return messages * link.latency + nbytes / link.bandwidth
