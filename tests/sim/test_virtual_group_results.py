"""Virtual-device collectives: exact results against the definitions, the literal ring
against the direct computation, inputs left untouched and outputs private, bad calls.

Values are float64 and compared with ``assert_close(rtol=1e-12, atol=1e-12)`` (only the
summation order can differ). (The bytes, messages and seconds: ``test_virtual_group.py``.)
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.sim.virtual_group_support import F64, group, members
from torch.testing import assert_close

from shardlab.config.hardware import LINKS
from shardlab.sim.ledger import Ledger
from shardlab.sim.ring_steps import ring_all_reduce_steps
from shardlab.sim.virtual_group import VirtualGroup

TOL = {"rtol": 1e-12, "atol": 1e-12}


def python_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros_like(xs[0])
    for x in xs:
        total = total + x
    return total


# ---------------------------------------------------------------------------
# Results against the definitions
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(), (7,), (4, 3)])
def test_all_reduce_is_the_sum(p: int, shape: tuple[int, ...]) -> None:
    xs = members(p, *shape)
    for algorithm in ("ring", "tree"):
        out = group(p, algorithm=algorithm).all_reduce(xs)
        assert len(out) == p
        for y in out:
            assert y.shape == xs[0].shape and y.dtype == F64
            assert_close(y, python_sum(xs), **TOL)


@pytest.mark.parametrize(("p", "rows"), [(1, 5), (3, 7), (4, 4), (4, 2), (3, 0)])
def test_reduce_scatter_gives_member_i_the_sum_of_chunk_i(p: int, rows: int) -> None:
    xs = members(p, rows, 3)
    out = group(p).reduce_scatter(xs)
    want = torch.tensor_split(python_sum(xs), p, dim=0)  # uneven: first chunks one row longer
    assert len(out) == p
    for y, w in zip(out, want, strict=True):
        assert y.shape == w.shape
        assert_close(y, w, **TOL)


def test_all_gather_concatenates_unequal_shards() -> None:
    xs = [torch.arange(k * 2, dtype=F64).reshape(k, 2) + 100 * k for k in (3, 1, 0, 2)]
    out = group(4).all_gather(xs)
    want = torch.cat(xs, dim=0)
    assert want.shape == (6, 2)
    for y in out:
        assert_close(y, want, rtol=0, atol=0)


def test_broadcast_copies_the_source() -> None:
    xs = members(4, 3, 2)
    out = group(4).broadcast([xs[0], None, xs[2], None], src=2)
    for y in out:
        assert_close(y, xs[2], rtol=0, atol=0)


def test_all_to_all_transposes_blocks() -> None:
    p = 3
    xs = [[torch.full((i + j,), 10.0 * i + j, dtype=F64) for j in range(p)] for i in range(p)]
    out = group(p).all_to_all(xs)
    for i in range(p):
        for j in range(p):
            assert_close(out[j][i], xs[i][j], rtol=0, atol=0)


def test_send_returns_a_copy() -> None:
    x = torch.arange(6, dtype=F64)
    y = group(2).send(x, 0, 1)
    assert_close(y, x, rtol=0, atol=0)
    assert y.data_ptr() != x.data_ptr()


def test_integer_all_reduce_keeps_its_dtype() -> None:
    xs = [torch.full((3,), i, dtype=torch.int32) for i in range(4)]
    out = group(4).all_reduce(xs)
    assert out[0].dtype == torch.int32
    assert out[0].tolist() == [6, 6, 6]


# ---------------------------------------------------------------------------
# The literal ring against the direct computation
# ---------------------------------------------------------------------------


@given(p=st.integers(1, 8), shape=st.lists(st.integers(0, 5), max_size=3),
       seed=st.integers(0, 2**16))
def test_step_by_step_ring_matches_all_reduce(p: int, shape: list[int], seed: int) -> None:
    xs = members(p, *shape, seed=seed)
    direct_ledger, steps_ledger = Ledger(p), Ledger(p)
    link = LINKS["IB NDR 400G"]
    direct = group(p, direct_ledger, link=link).all_reduce(xs)
    steps = ring_all_reduce_steps(xs, group(p, steps_ledger, link=link))
    for a, b in zip(direct, steps, strict=True):
        assert b.shape == a.shape
        assert_close(b, a, **TOL)
    assert steps_ledger.snapshot() == direct_ledger.snapshot()


def test_step_by_step_ring_alone_and_unmutated() -> None:
    xs = members(5, 11)
    before = [x.clone() for x in xs]
    out = ring_all_reduce_steps(xs)
    for x, b in zip(xs, before, strict=True):
        assert_close(x, b, rtol=0, atol=0)
    for y in out:
        assert_close(y, python_sum(xs), **TOL)


# ---------------------------------------------------------------------------
# No mutation, no aliasing
# ---------------------------------------------------------------------------


def _all_outputs(g: VirtualGroup, xs: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    return [
        g.all_reduce(xs),
        ring_all_reduce_steps(xs),
        g.reduce_scatter(xs),
        g.all_gather(xs),
        g.broadcast(list(xs), 1),
        [y for row in g.all_to_all([list(xs) for _ in xs]) for y in row],
        [g.send(xs[0], 0, 2)],
    ]


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_inputs_untouched_and_outputs_private(algorithm: str) -> None:
    xs = members(3, 6, 2)
    before = [x.clone() for x in xs]
    outs = _all_outputs(group(3, algorithm=algorithm), xs)
    for x, b in zip(xs, before, strict=True):
        assert_close(x, b, rtol=0, atol=0)
    input_ptrs = {x.untyped_storage().data_ptr() for x in xs}
    for out in outs:
        ptrs = [y.untyped_storage().data_ptr() for y in out]
        assert len(set(ptrs)) == len(ptrs), "two outputs share memory"
        assert not set(ptrs) & input_ptrs, "an output shares memory with an input"
        if len(out) > 1:
            keep = out[1].clone()
            out[0].add_(1.0)
            assert_close(out[1], keep, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# Programming errors
# ---------------------------------------------------------------------------


def test_bad_calls_raise_value_error() -> None:
    g = group(3)
    xs = members(3, 4)
    cases = [
        (lambda: g.all_reduce(xs[:2]), "3 members"),
        (lambda: g.all_reduce([xs[0], xs[1], torch.zeros(5, dtype=F64)]), "shape"),
        (lambda: g.all_reduce([xs[0], xs[1], xs[2].float()]), "float32"),
        (lambda: g.reduce_scatter([torch.tensor(1.0, dtype=F64)] * 3), "dimension"),
        (lambda: g.all_gather([torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3)]),
         "shape"),
        (lambda: g.broadcast(list(xs), 3), "src=3"),
        (lambda: g.broadcast([None, xs[1], xs[2]], 0), "None"),
        (lambda: g.broadcast([xs[0], torch.zeros(2, dtype=F64), None], 0), "shape"),
        (lambda: g.all_to_all([list(xs), list(xs), xs[:2]]), "2 blocks"),
        (lambda: g.send(xs[0], 0, -1), "dst=-1"),
        (lambda: g.send(xs[0], 1, 1), "both"),
        (lambda: g.all_reduce([xs[0], xs[1], [1.0]]), "torch.Tensor"),
        (lambda: ring_all_reduce_steps(xs, group(2)), "2 members"),
        (lambda: VirtualGroup([0, 0], Ledger(), "dp"), "distinct"),
        (lambda: VirtualGroup([0, 1], Ledger(), "dp", algorithm="butterfly"), "algorithm"),
        (lambda: VirtualGroup([], Ledger(), "dp"), "at least one"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words):
            call()
