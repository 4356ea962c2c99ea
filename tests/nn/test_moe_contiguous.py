"""Contiguous (forced-balanced) routing: its counts from T, k and E alone, its capacity as
counting would keep, the layer against a per-token loop of the forced experts (float64),
and the whole layer, forward and backward, on fake tensors (what ``dryrun`` needs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.testing import assert_close

from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError
from shardlab.nn.moe import (
    GroupedExperts,
    MoEFeedForward,
    MoEOptions,
    capacity_keep,
    dispatch,
    expert_capacity,
    expert_counts,
)
from shardlab.nn.moe_contiguous import contiguous_counts, contiguous_ids, contiguous_keep

F64 = torch.float64
EXACT = {"rtol": 1e-12, "atol": 1e-12}  # float64, the same math in another order


def shape(experts: int = 4, k: int = 2, style: str = "llama") -> ModelShape:
    return ModelShape("m", 1, 8, 2, 30, 16, style=style,
                      moe=MoE(experts=experts, experts_per_token=k, expert_d_ff=6))


@pytest.mark.parametrize(("tokens", "k", "experts"), [(7, 2, 4), (5, 3, 8), (16, 8, 8),
                                                      (1, 1, 3), (9, 2, 6)])
def test_counts_are_the_ids_counted_and_each_tokens_experts_distinct(
        tokens: int, k: int, experts: int) -> None:
    ids = contiguous_ids(tokens, k, experts)
    assert ids.shape == (tokens, k)
    assert all(len(set(row)) == k for row in ids.tolist())  # k distinct experts a token
    counts = contiguous_counts(tokens, k, experts)
    assert list(counts) == expert_counts(ids, experts).tolist()
    assert sum(counts) == tokens * k and max(counts) - min(counts) <= 1  # balanced


@pytest.mark.parametrize("capacity", [0, 1, 2, 3, 5])
def test_capacity_keeps_what_counting_keeps(capacity: int) -> None:
    ids = contiguous_ids(11, 3, 4)
    assert torch.equal(contiguous_keep(11, 3, 4, capacity), capacity_keep(ids, 4, capacity))


def layer(s: ModelShape, **options: float | str) -> MoEFeedForward:
    torch.manual_seed(0)
    m = MoEFeedForward(s, F64, routing="contiguous", **options)  # type: ignore[arg-type]
    with torch.no_grad():  # a router far from uniform, biases not zero
        for name, p in m.named_parameters():
            p.normal_(0, 1.0 if name.startswith("router") else 0.3)
    return m


def forced_loop(m: MoEFeedForward, x: torch.Tensor, capacity: int | None) -> torch.Tensor:
    """Token by token: token t's slot j at expert (t·k + j) mod E, its weight the router's
    softmax there renormalised over the k; an assignment past its expert's capacity (its
    place (t·k + j) // E) adds nothing."""
    ex, flat, k, big = m.experts, x.reshape(-1, x.shape[-1]), m.top_k, m.num_experts
    assert isinstance(ex, GroupedExperts)
    out = []
    for t, xt in enumerate(flat):
        probs = F.softmax(m.router(xt), dim=-1)
        chosen = [(t * k + j) % big for j in range(k)]
        weights = probs[chosen] / probs[chosen].sum()
        acc = torch.zeros_like(xt)
        for j, (w, e) in enumerate(zip(weights, chosen, strict=True)):
            if capacity is not None and (t * k + j) // big >= capacity:
                continue
            up = xt @ ex.w_up[e] + (ex.b_up[e] if ex.b_up is not None else 0)
            h = F.silu(xt @ ex.w_gate[e]) * up if ex.w_gate is not None else F.gelu(
                up, approximate="tanh")
            acc = acc + w * (h @ ex.w_down[e] + (ex.b_down[e] if ex.b_down is not None else 0))
        out.append(acc)
    return torch.stack(out).view_as(x)


@pytest.mark.parametrize("style", ["llama", "gpt"])
@pytest.mark.parametrize("capacity_factor", [0.0, 1.0, 0.5])
def test_layer_equals_the_forced_per_token_loop(style: str, capacity_factor: float) -> None:
    s = shape(style=style)
    m = layer(s, capacity_factor=capacity_factor)
    x = torch.randn(3, 5, 8, dtype=F64)
    capacity = expert_capacity(15, 2, 4, capacity_factor) if capacity_factor else None
    assert_close(m(x), forced_loop(m, x, capacity), **EXACT)
    assert m.last_static_counts == (8, 8, 7, 7) == tuple(m.last_counts.tolist())
    cap = 30 if capacity is None else capacity
    assert m.last_dropped == sum(max(0, c - cap) for c in (8, 8, 7, 7))
    assert (m.last_dropped > 0) == (capacity_factor == 0.5)


def test_the_router_still_learns_and_the_aux_loss_sees_the_forced_counts() -> None:
    m = layer(shape(), aux_coef=0.01)
    x = torch.randn(2, 4, 8, dtype=F64)
    m(x).sum().backward()
    assert m.router.weight.grad is not None and m.router.weight.grad.abs().sum() > 0
    # Balanced counts: the load-balancing loss is E * sum_e (1/E) * P_e = 1 (times coef).
    r = dispatch(x.reshape(-1, 8), m.router(x.reshape(-1, 8)), 2,
                 MoEOptions(aux_coef=1.0, routing="contiguous"))
    assert r.aux is not None and r.static_counts == (4, 4, 4, 4)
    assert_close(r.aux, torch.ones((), dtype=F64), **EXACT)


def test_forward_and_backward_run_on_fake_tensors() -> None:
    with FakeTensorMode(allow_non_fake_inputs=False):
        m = MoEFeedForward(shape(experts=8, k=2), routing="contiguous", capacity_factor=1.0,
                           aux_coef=0.01)
        x = torch.randn(2, 7, 8, requires_grad=True)
        y = m(x)
        y.sum().backward()
    assert isinstance(y, FakeTensor) and y.shape == (2, 7, 8)
    assert m.last_static_counts == contiguous_counts(14, 2, 8) and m.last_dropped == 0


def test_learned_routing_reads_its_counts_and_an_unknown_routing_is_refused() -> None:
    m = MoEFeedForward(shape())
    m(torch.randn(1, 3, 8))
    assert m.last_static_counts is None and int(m.last_counts.sum()) == 6
    with pytest.raises(SpecError, match="routing='random': must be one of learned, contiguous"):
        MoEOptions(routing="random")
