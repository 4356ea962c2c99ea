"""Virtual-device collectives: the bytes each algorithm sends, its messages and alpha-beta
seconds, the ledger that records them.

Byte, message and call counts are compared exactly; seconds with ``rtol=1e-12``. (What
the collectives compute: ``test_virtual_group_results.py``.)
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from tests.sim.virtual_group_support import F64, group, members
from torch.testing import assert_close

from shardlab.config.hardware import LINKS
from shardlab.estimate.comm import (
    ring_all_gather_sent,
    ring_allreduce_bytes,
    ring_allreduce_seconds,
    ring_allreduce_sent,
    ring_chunks,
    ring_gather_bytes,
    ring_gather_seconds,
    ring_reduce_scatter_sent,
)
from shardlab.sim.ledger import Ledger
from shardlab.sim.ring_steps import ring_all_reduce_steps
from shardlab.sim.virtual_group import VirtualGroup


def sent(ledger: Ledger, p: int) -> list[int]:
    return [ledger.sent(r) for r in range(p)]


def recv(ledger: Ledger, p: int) -> list[int]:
    return [ledger.recv(r) for r in range(p)]


def msgs(ledger: Ledger, p: int) -> list[int]:
    return [ledger.messages(r) for r in range(p)]


# ---------------------------------------------------------------------------
# Bytes against the ring formulas
# ---------------------------------------------------------------------------

N = 840  # divisible by every p in 1..8


@pytest.mark.parametrize("p", range(1, 9))
def test_ring_all_reduce_bytes_when_divisible(p: int) -> None:
    ledger = Ledger(p)
    group(p, ledger).all_reduce([torch.zeros(N, dtype=torch.float32)] * p)
    nbytes = N * 4
    want = int(ring_allreduce_bytes(nbytes, p))
    assert want == 2 * (p - 1) * nbytes // p
    assert sent(ledger, p) == [want] * p
    assert recv(ledger, p) == [want] * p
    assert msgs(ledger, p) == [2 * (p - 1)] * p


@pytest.mark.parametrize("p", range(1, 9))
def test_ring_reduce_scatter_and_all_gather_bytes_when_divisible(p: int) -> None:
    nbytes = N * 2 * 8  # N rows of 2 float64
    ledger = Ledger(p)
    g = group(p, ledger)
    shards = g.reduce_scatter(members(p, N, 2))
    want = int(ring_gather_bytes(nbytes, p))
    assert sent(ledger, p) == [want] * p and recv(ledger, p) == [want] * p
    assert msgs(ledger, p) == [p - 1] * p
    ledger.reset()
    g.all_gather(shards)
    assert sent(ledger, p) == [want] * p and recv(ledger, p) == [want] * p
    assert msgs(ledger, p) == [p - 1] * p


def test_ring_all_reduce_bytes_uneven() -> None:
    # 10 float64 over 4 members: chunks of 3, 3, 2, 2 elements = 24, 24, 16, 16 bytes.
    p, c = 4, [24, 24, 16, 16]
    ledger = Ledger(p)
    group(p, ledger).all_reduce(members(p, 10))
    n = sum(c)
    assert sent(ledger, p) == [2 * n - c[(r + 1) % p] - c[(r + 2) % p] for r in range(p)]
    assert recv(ledger, p) == [2 * n - c[r] - c[(r + 1) % p] for r in range(p)]
    assert sent(ledger, p) == [120, 128, 120, 112]  # not all equal
    assert sum(sent(ledger, p)) == sum(recv(ledger, p)) == 2 * (p - 1) * n


@pytest.mark.parametrize(("p", "numel"), [(3, 10), (5, 3), (8, 17), (6, 0)])
def test_uneven_totals(p: int, numel: int) -> None:
    ledger = Ledger(p)
    g = group(p, ledger)
    g.all_reduce(members(p, numel))
    assert sum(sent(ledger, p)) == sum(recv(ledger, p)) == 2 * (p - 1) * numel * 8
    ledger.reset()
    g.reduce_scatter(members(p, numel, 2))
    assert sum(sent(ledger, p)) == sum(recv(ledger, p)) == (p - 1) * numel * 2 * 8
    assert msgs(ledger, p) == [p - 1] * p  # empty chunks are still ring steps
    ledger.reset()
    shards = [torch.zeros(k, dtype=F64) for k in range(p)]  # member r has r elements
    g.all_gather(shards)
    total = sum(range(p)) * 8
    # Member r never sends chunk r+1 and never receives its own chunk r.
    assert sent(ledger, p) == [total - 8 * ((r + 1) % p) for r in range(p)]
    assert recv(ledger, p) == [total - 8 * r for r in range(p)]


@pytest.mark.parametrize("p", [3, 5, 6])
@pytest.mark.parametrize("numel", [1, 7, 29, 31])
def test_the_cost_models_exact_bytes_are_the_rings(p: int, numel: int) -> None:
    """Each member's bytes, counted chunk by chunk (the literal ring) and by the group, equal
    the torch-free per-rank formulas of estimate/comm.py on sizes p does not divide."""
    literal, direct = Ledger(p), Ledger(p)
    ring_all_reduce_steps(members(p, numel), group(p, literal))
    g = group(p, direct)
    g.all_reduce(members(p, numel))
    want = [ring_allreduce_sent(numel, p, r, 8) for r in range(p)]
    assert sent(literal, p) == sent(direct, p) == want
    row = 3 * 8  # rows of 3 float64
    direct.reset()
    g.reduce_scatter(members(p, numel, 3))
    assert sent(direct, p) == [ring_reduce_scatter_sent(numel, p, r, row) for r in range(p)]
    direct.reset()
    g.all_gather([torch.zeros(k, 3, dtype=F64) for k in ring_chunks(numel, p)])
    assert sent(direct, p) == [ring_all_gather_sent(numel, p, r, row) for r in range(p)]


def test_size_one_groups_record_nothing() -> None:
    ledger = Ledger(1)
    g = group(1, ledger, link=LINKS["NVLink 4"])
    x = members(1, 4, 2)
    g.all_reduce(x)
    g.reduce_scatter(x)
    g.all_gather(x)
    g.broadcast(x, 0)
    g.all_to_all([x])
    ring_all_reduce_steps(x, g)
    assert ledger.snapshot() == {"0": {"sent": 0, "recv": 0, "messages": 0, "seconds": 0.0,
                                       "by_kind": {}, "by_op": {}}}


# ---------------------------------------------------------------------------
# Tree, broadcast, all-to-all and send accounting
# ---------------------------------------------------------------------------


def test_tree_all_reduce_bytes() -> None:
    # Binomial tree on 8 from member 0: children 0->{1,2,4}, 2->{3}, 4->{5,6}, 6->{7}.
    p, n = 8, 5 * 8
    ledger = Ledger(p)
    link = LINKS["NVLink 4"]
    group(p, ledger, link=link, algorithm="tree").all_reduce(members(p, 5))
    kids = [3, 0, 1, 0, 2, 0, 1, 0]
    up = [0] + [1] * (p - 1)  # every non-root sends n to its parent once
    assert sent(ledger, p) == [n * (k + u) for k, u in zip(kids, up, strict=True)]
    assert recv(ledger, p) == sent(ledger, p)
    assert msgs(ledger, p) == [k + u for k, u in zip(kids, up, strict=True)]
    assert sum(sent(ledger, p)) == 2 * (p - 1) * n
    assert_close(ledger.seconds(0), 2 * 3 * (link.latency + n / link.bandwidth), rtol=1e-12,
                 atol=0)


@pytest.mark.parametrize("p", range(2, 9))
def test_tree_all_reduce_totals(p: int) -> None:
    ledger = Ledger(p)
    group(p, ledger, algorithm="tree").all_reduce(members(p, 3))
    assert sum(sent(ledger, p)) == sum(recv(ledger, p)) == 2 * (p - 1) * 24
    assert ledger.sent(0) == math.ceil(math.log2(p)) * 24  # the root only sends down


def test_broadcast_accounting() -> None:
    p, src, n = 5, 3, 4 * 8
    xs: list[torch.Tensor | None] = [None] * p
    xs[src] = members(1, 4)[0]
    chain = Ledger(p)
    group(p, chain).broadcast(xs, src)
    # Chain 3 -> 4 -> 0 -> 1 -> 2: all but the last (member 2) send n once.
    assert sent(chain, p) == [n, n, 0, n, n]
    assert recv(chain, p) == [n, n, n, 0, n]
    assert msgs(chain, p) == [1, 1, 0, 1, 1]
    tree = Ledger(p)
    group(p, tree, algorithm="tree").broadcast(xs, src)
    # Binomial tree on virtual ranks v = (r - 3) mod 5: 0->{1,2,4}, 2->{3}.
    # Member 3 is v0, member 0 is v2, member 2 is v4, members 4 and 1 are v1 and v3.
    assert sent(tree, p) == [n, 0, 0, 3 * n, 0]
    assert recv(tree, p) == [n, n, n, 0, n]
    assert msgs(tree, p) == [1, 0, 0, 3, 0]


def test_all_to_all_accounting() -> None:
    p = 3
    sizes = [[2, 3, 4], [0, 5, 1], [6, 7, 8]]  # elements from i to j
    xs = [[torch.zeros(sizes[i][j], dtype=F64) for j in range(p)] for i in range(p)]
    ledger = Ledger(p)
    group(p, ledger).all_to_all(xs)
    assert sent(ledger, p) == [8 * 7, 8 * 1, 8 * 13]  # own block not sent
    assert recv(ledger, p) == [8 * 6, 8 * 10, 8 * 5]
    assert msgs(ledger, p) == [p - 1] * p


def test_send_accounting_uses_global_ranks() -> None:
    ledger = Ledger(8)
    link = LINKS["IB HDR 200G"]
    pipe = VirtualGroup([2, 6], ledger, "pp", link=link)
    pipe.send(torch.zeros(3, 4, dtype=torch.float32), src=1, dst=0)
    assert ledger.sent(6) == 48 and ledger.messages(6) == 1 and ledger.recv(6) == 0
    assert ledger.recv(2) == 48 and ledger.messages(2) == 0 and ledger.sent(2) == 0
    assert [ledger.sent(r) for r in (0, 1, 3, 4, 5, 7)] == [0] * 6
    for r in (2, 6):
        assert ledger.traffic(r).by_kind["pp"]["calls"] == 1
        assert_close(ledger.seconds(r, "pp"), link.latency + 48 / link.bandwidth, rtol=1e-12,
                     atol=0)


# ---------------------------------------------------------------------------
# Ledger
# ---------------------------------------------------------------------------


def test_ledger_kinds_ops_snapshot_and_reset() -> None:
    ledger = Ledger(4)
    link = LINKS["NVLink 4"]
    dp = VirtualGroup([0, 2], ledger, "dp", link=link)
    tp = VirtualGroup([0, 1], ledger, "tp", link=link)
    x = torch.zeros(8, dtype=torch.float32)
    dp.all_reduce([x, x])
    dp.all_reduce([x, x])
    tp.all_gather([x, x])
    assert ledger.sent(0, "dp") == 2 * 32 and ledger.sent(0, "tp") == 32
    assert ledger.sent(0) == 3 * 32
    assert ledger.sent(0, op="all_gather") == 32 and ledger.sent(0, "dp", "all_gather") == 0
    assert ledger.traffic(0).by_kind["dp"]["calls"] == 2
    assert ledger.traffic(0).by_op["tp/all_gather"]["calls"] == 1
    assert ledger.sent(3) == 0 and ledger.sent(99) == 0
    snap = ledger.snapshot()
    assert list(snap) == ["0", "1", "2", "3"]
    assert json.loads(json.dumps(snap)) == snap
    assert snap["2"]["by_kind"]["dp"] == {"sent": 64, "recv": 64, "messages": 4, "calls": 2,
                                          "seconds": ledger.seconds(2, "dp")}
    ledger.reset()
    assert ledger.ranks == [0, 1, 2, 3]
    assert ledger.sent(0) == 0 and ledger.traffic(0).by_kind == {}
    assert snap["0"]["sent"] == 96  # the snapshot is a copy


# ---------------------------------------------------------------------------
# Alpha-beta seconds
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["IB NDR 400G", "NVLink 4"])
def test_seconds_match_the_cost_model(name: str) -> None:
    link, p = LINKS[name], 8
    ledger = Ledger(p)
    g = group(p, ledger, link=link)
    xs = [torch.zeros(N, dtype=torch.float32)] * p
    g.all_reduce(xs)
    want = ring_allreduce_seconds(N * 4, p, link)
    for r in range(p):
        assert_close(ledger.seconds(r, "dp", "all_reduce"), want, rtol=1e-12, atol=0)
    g.reduce_scatter(xs)
    assert_close(ledger.seconds(0, op="reduce_scatter"), ring_gather_seconds(N * 4, p, link),
                 rtol=1e-12, atol=0)
    assert_close(ledger.seconds(0), want + ring_gather_seconds(N * 4, p, link), rtol=1e-12,
                 atol=0)


def test_uneven_seconds_use_the_busiest_member() -> None:
    link, p = LINKS["100 GbE"], 4
    ledger = Ledger(p)
    group(p, ledger, link=link).all_reduce(members(p, 10))
    assert_close(ledger.seconds(0), 2 * (p - 1) * link.latency + 128 / link.bandwidth,
                 rtol=1e-12, atol=0)


def test_no_link_means_zero_seconds() -> None:
    ledger = Ledger(4)
    group(4, ledger).all_reduce(members(4, 8))
    assert ledger.seconds(0) == 0.0 and ledger.sent(0) > 0
