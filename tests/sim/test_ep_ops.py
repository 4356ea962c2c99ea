"""Expert parallel's all-to-all: uneven splits, counted bytes, and its autograd form.

Values are float64 and moved, never summed, so results are compared exactly
(``rtol=0, atol=0``); gradients against one device's with ``rtol=atol=1e-12``; bytes and
messages exactly.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from shardlab.config.hardware import LINKS
from shardlab.sim.ep_ops import all_to_all_autograd, transpose
from shardlab.sim.ledger import Ledger
from shardlab.sim.virtual_group import VirtualGroup

F64 = torch.float64
# Rows member i sends member j, for a group of 3: odd sizes, an empty block, a member
# that keeps nothing for itself.
SPLITS = [[2, 0, 3], [1, 4, 0], [5, 1, 1]]


def _rows(splits: list[list[int]], width: int = 2) -> list[torch.Tensor]:
    """Member i's tensor: row values 100·i + row index, so every row says where it is from."""
    return [(100.0 * i + torch.arange(sum(row), dtype=F64))[:, None].expand(-1, width)
            .contiguous() for i, row in enumerate(splits)]


def test_all_to_all_single_delivers_each_block_in_member_order() -> None:
    xs = _rows(SPLITS)
    out = VirtualGroup([0, 1, 2], Ledger(3), "ep").all_to_all_single(xs, SPLITS)
    for j in range(3):
        want = torch.cat([xs[i].split(SPLITS[i])[j] for i in range(3)])
        assert_close(out[j], want, rtol=0, atol=0)
    assert [y.shape[0] for y in out] == [8, 5, 4]


def test_all_to_all_single_counts_rows_to_other_members_only() -> None:
    ledger = Ledger(6)
    g = VirtualGroup([1, 3, 5], ledger, "ep")  # global ranks, not positions
    g.all_to_all_single(_rows(SPLITS, width=3), SPLITS)
    row = 3 * 8  # three float64 elements
    assert [ledger.sent(r, "ep", "all_to_all") for r in (1, 3, 5)] == [3 * row, 1 * row,
                                                                       6 * row]
    assert [ledger.recv(r) for r in (1, 3, 5)] == [6 * row, 1 * row, 3 * row]
    assert [ledger.messages(r) for r in (1, 3, 5)] == [2, 2, 2]
    assert [ledger.sent(r) for r in (0, 2, 4)] == [0, 0, 0]


def test_all_to_all_seconds_are_the_busiest_member_pairwise() -> None:
    ledger, link = Ledger(3), LINKS["100 GbE"]
    VirtualGroup([0, 1, 2], ledger, "ep", link).all_to_all_single(_rows(SPLITS), SPLITS)
    assert_close(ledger.seconds(0), 2 * link.latency + 6 * 16 / link.bandwidth,
                 rtol=1e-12, atol=0)


def test_a_group_of_one_keeps_its_rows_and_counts_nothing() -> None:
    ledger = Ledger(1)
    x = torch.arange(6, dtype=F64).view(3, 2)
    (y,) = VirtualGroup([0], ledger, "ep").all_to_all_single([x], [[3]])
    assert_close(y, x, rtol=0, atol=0) and ledger.sent(0) == 0
    assert y.data_ptr() != x.data_ptr()


def test_bad_splits_raise_value_error() -> None:
    g, xs = VirtualGroup([0, 1, 2], Ledger(3), "ep"), _rows(SPLITS)
    for splits, words in (([[2, 0, 3], [1, 4, 0], [5, 1, 2]], "sum to 8"),
                          ([[2, 0, 3], [1, 4, 0], [5, 2]], "3 row counts"),
                          ([[2, 0, 3], [1, 4, 0], [5, 1, -1, 2]], "3 row counts")):
        with pytest.raises(ValueError, match=words):
            g.all_to_all_single(xs, splits)


def test_transpose_is_the_reverse_exchange() -> None:
    g = VirtualGroup([0, 1, 2], Ledger(3), "ep")
    xs = _rows(SPLITS)
    back = g.all_to_all_single(g.all_to_all_single(xs, SPLITS), transpose(SPLITS))
    for x, y in zip(xs, back, strict=True):
        assert_close(y, x, rtol=0, atol=0)


def test_autograd_backward_is_the_reverse_all_to_all_and_counted() -> None:
    """A loss of every member's received rows: the gradients reaching each member's input
    equal those of the same loss computed on one device, and the backward sends the
    forward's bytes back."""
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(sum(row), 4, generator=gen, dtype=F64) for row in SPLITS]
    weights = [torch.randn(n, 4, generator=gen, dtype=F64) for n in (8, 5, 4)]
    ledger = Ledger(3)
    g = VirtualGroup([0, 1, 2], ledger, "ep")
    leaves = [x.clone().requires_grad_() for x in xs]
    outs = all_to_all_autograd(g, leaves, SPLITS)
    sent = [ledger.sent(r) for r in range(3)]
    received = [ledger.recv(r) for r in range(3)]
    sum((o.tanh() * w).sum() for o, w in zip(outs, weights, strict=True)).backward()

    ref = [x.clone().requires_grad_() for x in xs]
    blocks = [r.split(row) for r, row in zip(ref, SPLITS, strict=True)]
    moved = [torch.cat([blocks[i][j] for i in range(3)]) for j in range(3)]
    sum((o.tanh() * w).sum() for o, w in zip(moved, weights, strict=True)).backward()
    for a, b in zip(leaves, ref, strict=True):
        assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)
    # Backward sends back what each member received from the others.
    assert [ledger.sent(r) - s for r, s in enumerate(sent)] == received
    assert ledger.traffic(0).by_kind["ep"]["calls"] == 2
