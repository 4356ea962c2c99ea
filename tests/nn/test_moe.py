"""The mixture-of-experts layer: routing, losses, dropping, dispatch, and the layer against
a per-token loop written from the formulas (float64, so agreement is to rounding)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError
from shardlab.nn.mlp import MLP
from shardlab.nn.moe import (
    GroupedExperts,
    MoEFeedForward,
    MoEOptions,
    capacity_keep,
    expert_capacity,
    expert_counts,
    grouped_mlp,
    load_balance_loss,
    permute,
    route,
    router_z_loss,
    unpermute,
)

F64 = torch.float64
EXACT = {"rtol": 1e-12, "atol": 1e-12}  # float64, the same math in another order


def shape(style: str = "llama", **moe: int | bool) -> ModelShape:
    spec = {"experts": 4, "experts_per_token": 2, "expert_d_ff": 6} | moe
    return ModelShape("m", 1, 8, 2, 30, 16, style=style, moe=MoE(**spec))  # type: ignore[arg-type]


def layer(s: ModelShape, seed: int = 0, **options: float) -> MoEFeedForward:
    torch.manual_seed(seed)
    m = MoEFeedForward(s, F64, **options)
    with torch.no_grad():  # a router far from uniform, biases not zero
        for name, p in m.named_parameters():
            p.normal_(0, 1.0 if name.startswith("router") else 0.3)
    return m


def naive(m: MoEFeedForward, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Token by token: sum over its top-k of weight * expert(x), from the weights."""
    ex, flat = m.experts, x.reshape(-1, x.shape[-1])
    assert isinstance(ex, GroupedExperts)
    out = []
    for t, xt in enumerate(flat):
        probs = F.softmax(m.router(xt), dim=-1)
        top, ids = probs.topk(m.top_k)
        acc = torch.zeros_like(xt)
        for j, (w, e) in enumerate(zip(top / top.sum(), ids.tolist(), strict=True)):
            if keep is not None and not keep[t, j]:
                continue
            up = xt @ ex.w_up[e] + (ex.b_up[e] if ex.b_up is not None else 0)
            h = F.silu(xt @ ex.w_gate[e]) * up if ex.w_gate is not None else F.gelu(
                up, approximate="tanh")
            acc = acc + w * (h @ ex.w_down[e] + (ex.b_down[e] if ex.b_down is not None else 0))
        out.append(acc + (m.shared(xt) if m.shared is not None else 0))
    return torch.stack(out).view_as(x)


def test_route_renormalises_the_top_k() -> None:
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 1.0, 1.0, 2.0]], dtype=F64))
    weights, ids = route(logits, 2)
    assert ids.tolist() == [[3, 2], [0, 3]] and ids.dtype == torch.long
    assert_close(weights, torch.tensor([[4 / 7, 3 / 7], [4 / 6, 2 / 6]], dtype=F64), **EXACT)
    w16, _ = route(logits.to(torch.bfloat16), 2)
    assert w16.dtype == torch.bfloat16  # softmax in float32, weights in the input's dtype


def test_load_balance_and_z_loss_by_hand() -> None:
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.4, 0.1, 0.3, 0.2]], dtype=F64)
    ids = torch.tensor([[0, 1], [0, 2]])
    # f = [2, 1, 1, 0] / 4, P = [.4, .2, .25, .15]: 4 * (.2 + .05 + .0625) = 1.25
    assert_close(load_balance_loss(probs, ids, 4), torch.tensor(1.25, dtype=F64), **EXACT)
    uniform = torch.full((6, 3), 1 / 3, dtype=F64)
    assert_close(load_balance_loss(uniform, torch.tensor([[0], [1], [2]] * 2), 3),
                 torch.tensor(1.0, dtype=F64), **EXACT)
    assert_close(router_z_loss(torch.zeros(5, 4, dtype=F64)),
                 torch.tensor(math.log(4) ** 2, dtype=F64), **EXACT)
    assert expert_counts(ids, 5).tolist() == [2, 1, 1, 0, 0]


def test_permute_groups_by_expert_and_unpermute_inverts() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 3, dtype=F64, generator=gen)
    ids = torch.stack([torch.randperm(5, generator=gen)[:2] for _ in range(7)])
    x_sorted, order = permute(x, ids)
    sorted_ids = ids.reshape(-1)[order]
    assert (sorted_ids.diff() >= 0).all() and x_sorted.shape == (14, 3)
    assert_close(x_sorted, x[order // 2], rtol=0, atol=0)
    weights = torch.rand(7, 2, dtype=F64, generator=gen)
    assert_close(unpermute(x_sorted, order, weights, 7), x * weights.sum(1, keepdim=True),
                 **EXACT)


def test_capacity_keeps_each_experts_first_tokens() -> None:
    ids = torch.tensor([[0, 1], [0, 1], [1, 0], [2, 1]])
    assert expert_capacity(4, 2, 3, 1.0) == 3 and expert_capacity(4, 2, 3, 0.5) == 2
    keep = capacity_keep(ids, 3, 2)
    assert keep.tolist() == [[True, True], [True, True], [False, False], [True, False]]


@pytest.mark.parametrize(("style", "moe"), [
    ("llama", {}), ("gpt", {}), ("llama", {"shared_experts": 2, "router_bias": True}),
    ("gpt", {"shared_experts": 1, "shared_d_ff": 5, "experts_per_token": 1})])
def test_layer_equals_a_per_token_loop(style: str, moe: dict[str, int]) -> None:
    m = layer(shape(style, **moe))
    x = torch.randn(2, 5, 8, dtype=F64)
    y = m(x)
    assert_close(y, naive(m, x), **EXACT)
    assert m.last_counts.sum() == 10 * m.top_k and m.last_dropped == 0


def test_capacity_drops_assignments_past_it() -> None:
    m = layer(shape(), capacity_factor=0.5)
    x = torch.randn(1, 12, 8, dtype=F64)
    _, ids = route(m.router(x[0]), 2)
    keep = capacity_keep(ids, 4, expert_capacity(12, 2, 4, 0.5))  # 3 per expert
    assert not keep.all()  # the far-from-uniform router overflows some expert
    assert_close(m(x), naive(m, x, keep), **EXACT)
    assert m.last_dropped == int((~keep).sum())
    assert m.last_counts.tolist() == expert_counts(ids, 4).tolist()  # before dropping


def test_aux_gradient_is_exactly_coef_times_the_losses() -> None:
    s, x = shape(), torch.randn(2, 6, 8, dtype=F64)
    plain, aux = layer(s), layer(s, aux_coef=0.3, z_coef=0.05)
    assert_close(aux(x), plain(x), rtol=0, atol=0)  # identity forward
    aux(x).sum().backward()
    plain(x).sum().backward()
    logits = plain.router(x.reshape(-1, 8))
    _, ids = route(logits, 2)
    extra = (0.3 * load_balance_loss(F.softmax(logits, -1), ids, 4)
             + 0.05 * router_z_loss(logits))
    assert_close(aux.last_aux, extra.detach(), **EXACT)
    (want,) = torch.autograd.grad(extra, plain.router.weight)
    assert want.abs().max() > 1e-3  # the aux losses do reach the router
    assert plain.router.weight.grad is not None and aux.router.weight.grad is not None
    assert_close(aux.router.weight.grad - plain.router.weight.grad, want, **EXACT)
    for (name, a), b in zip(aux.named_parameters(), plain.parameters(), strict=True):
        if not name.startswith("router"):  # experts see only the LM gradient
            assert a.grad is not None and b.grad is not None
            assert_close(a.grad, b.grad, **EXACT)


@pytest.mark.parametrize("style", ["llama", "gpt"])
def test_shared_experts_are_separate_experts_summed(style: str) -> None:
    s = shape(style, shared_experts=3, shared_d_ff=4)
    merged = MLP(s, F64, 12)
    x = torch.randn(5, 8, dtype=F64)
    total = torch.zeros(5, 8, dtype=F64)
    for i in range(3):  # expert i owns hidden units 4i..4i+3
        one, cut = MLP(s, F64, 4), slice(4 * i, 4 * i + 4)
        with torch.no_grad():
            for name in ("gate_proj", "up_proj"):
                if hasattr(merged, name):
                    getattr(one, name).weight.copy_(getattr(merged, name).weight[cut])
                    if getattr(one, name).bias is not None:
                        getattr(one, name).bias.copy_(getattr(merged, name).bias[cut])
            one.down_proj.weight.copy_(merged.down_proj.weight[:, cut])
            if one.down_proj.bias is not None:  # the merged down bias, split three ways
                one.down_proj.bias.copy_(merged.down_proj.bias / 3)
        total = total + one(x)
    assert_close(merged(x), total, **EXACT)


class TwoRanks(nn.Module):
    """A stand-in for the expert-parallel wrapper: experts 0-1 and 2-3 run apart."""

    def __init__(self, experts: GroupedExperts) -> None:
        super().__init__()
        self.inner = experts

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        e, rows = self.inner, counts.tolist()
        parts = x_sorted.split([sum(rows[:2]), sum(rows[2:])])
        return torch.cat([grouped_mlp(p, rows[h:h + 2], e.w_gate[h:h + 2], e.w_up[h:h + 2],
                                      e.w_down[h:h + 2]) for p, h in zip(parts, (0, 2),
                                                                        strict=True)])


def test_experts_can_be_replaced_by_a_module_of_the_same_signature() -> None:
    m = layer(shape(shared_experts=1), capacity_factor=0.75)
    x = torch.randn(2, 4, 8, dtype=F64)
    want = m(x)
    assert isinstance(m.experts, GroupedExperts)
    m.experts = TwoRanks(m.experts)
    assert_close(m(x), want, rtol=0, atol=0)


def test_an_expert_with_no_tokens_gets_a_zero_gradient() -> None:
    ex = GroupedExperts(3, 4, 5, swiglu=True, bias=False, dtype=F64)
    x = torch.randn(4, 4, dtype=F64)
    grouped_mlp(x, [2, 0, 2], ex.w_gate, ex.w_up, ex.w_down).sum().backward()
    assert ex.w_up.grad is not None and ex.w_up.grad[1].abs().max() == 0
    assert ex.w_up.grad[0].abs().max() > 0


@pytest.mark.parametrize(("field", "value"), [("aux_coef", -1.0), ("z_coef", float("nan")),
                                              ("capacity_factor", float("inf")),
                                              ("aux_coef", True)])
def test_options_are_checked(field: str, value: float) -> None:
    with pytest.raises(SpecError, match=f"^{field}="):
        MoEOptions(**{field: value})
    with pytest.raises(SpecError, match=f"^{field}="):
        MoEFeedForward(shape(), **{field: value})
