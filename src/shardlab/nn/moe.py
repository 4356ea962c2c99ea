"""The mixture-of-experts MLP: a top-k router, grouped experts, shared experts, aux losses.

A MoE layer replaces a block's dense MLP by ``experts`` MLPs of width ``expert_d_ff``; a
router sends each token to ``top_k`` of them and sums their outputs weighted by the
router's probabilities (Shazeer et al. 2017, "Outrageously Large Neural Networks";
GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021). Here as Mixtral
(Jiang et al. 2024): softmax over all experts, top-k, the k weights renormalised to sum
to 1. DeepSeek-style shared experts (DeepSeekMoE, Dai et al. 2024) see every token and
are added unweighted.

The pipeline of one forward, on the T = b*s tokens of a micro-batch on one rank::

    logits = router(x)                    # [T, E]
    weights, ids = route(logits, k)       # [T, k] each
    keep = capacity_keep(ids, E, C)       # optional: GShard/Switch token dropping
    x_sorted, order = permute(x, ids)     # [T*k, d], rows grouped by expert id
    y_sorted = experts(x_sorted, counts)  # each expert on its contiguous rows
    y = unpermute(y_sorted, order, weights, T) + shared(x)

The pure functions are the float math the model, the simulator and the expert-parallel
runtime share; ``MoEFeedForward.experts`` is the expert-parallel hook (any module with
the signature ``(x_sorted [N, d] sorted by global expert id, counts LongTensor[E]) ->
[N, d]``: the EP wrapper all-to-alls rows to the ranks owning the experts and back).

The auxiliary losses (load balance, router z-loss) reach the gradients without touching
the loss plumbing: :class:`AttachAuxLoss` is the identity on the layer's output in
forward and, in backward, also sends gradient 1 into ``coef * aux`` (the idea of
Megatron-LM's ``MoEAuxLossAutoScaler``). So the objective is the LM loss plus, for every
forward call (every micro-batch, every MoE layer), ``aux_coef * load_balance_loss +
z_coef * router_z_loss`` of that call's tokens, unscaled by the token count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from shardlab.config.model import MOE_ROUTINGS, ModelShape
from shardlab.errors import SpecError
from shardlab.nn.mlp import MLP
from shardlab.nn.moe_capacity import capacity_keep, expert_capacity
from shardlab.nn.moe_contiguous import (
    capped,
    contiguous_counts,
    contiguous_ids,
    contiguous_keep,
    contiguous_weights,
)

INIT_STD = 0.02
"""GPT-2's init (Radford et al. 2019), as :meth:`TransformerLM.reset_parameters`."""


class CountReducer(Protocol):
    """Sums a LongTensor [E] of expert counts over ``ranks`` ranks (no gradient)."""

    ranks: int

    def __call__(self, counts: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class MoEOptions:
    """Training options of every MoE layer of a model (none changes its parameters).

    ``aux_coef``: weight of the load-balancing loss (Switch: 1e-2; Mixtral's HF config
    0.02 on its k-times-larger form). ``z_coef``: weight of the router z-loss (ST-MoE:
    1e-3). ``capacity_factor``: 0 is dropless; > 0 caps each expert at
    ceil(capacity_factor * T * k / E) of the T tokens of one forward (:func:`expert_capacity`).
    ``routing``: ``learned`` (the router's top-k) or ``contiguous`` (forced balance, every
    count known in advance: :mod:`shardlab.nn.moe_contiguous`).
    """

    aux_coef: float = 0.0
    z_coef: float = 0.0
    capacity_factor: float = 0.0
    routing: str = "learned"

    def __post_init__(self) -> None:
        for name in ("aux_coef", "z_coef", "capacity_factor"):
            check_option(name, getattr(self, name))
        if self.routing not in MOE_ROUTINGS:
            raise SpecError("routing", self.routing,
                            f"must be one of {', '.join(MOE_ROUTINGS)}")


def check_option(name: str, value: object) -> None:
    """A finite number >= 0, else SpecError naming ``name``."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 <= value < math.inf):
        raise SpecError(name, value, "must be a finite number >= 0")


# --- routing --------------------------------------------------------------------------

def router_dtype(dtype: torch.dtype) -> torch.dtype:
    """The router's softmax runs in float32 (float64 for float64 models, for parity tests)."""
    return torch.promote_types(dtype, torch.float32)


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral's router (Jiang et al. 2024): softmax over all E experts in float32, the
    top-k, their k weights renormalised to sum 1.

    logits [T, E] -> (weights [T, k] in the logits' dtype, ids [T, k] long, highest first).
    """
    probs = F.softmax(logits.to(router_dtype(logits.dtype)), dim=-1)
    top, ids = probs.topk(top_k, dim=-1)
    return (top / top.sum(dim=-1, keepdim=True)).to(logits.dtype), ids


def expert_counts(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """Token assignments per expert: LongTensor [E] from ids [T, k] (values in 0..E-1)."""
    return torch.bincount(ids.reshape(-1), minlength=experts)


def load_balance_loss(probs: torch.Tensor, ids: torch.Tensor, experts: int,
                      counts: tuple[int, ...] | None = None,
                      reduce: CountReducer | None = None) -> torch.Tensor:
    """Switch Transformer's load-balancing loss (Fedus et al. 2021, eq. 4), top-k form:
    ``E * sum_e f_e * P_e``, f_e the share of the T*k assignments that go to expert e,
    P_e the mean router probability of e over the T tokens. 1 when routing is uniform.

    probs [T, E] (softmax of all logits), ids [T, k] -> scalar; the gradient flows
    through P only. (transformers' Mixtral ``load_balancing_loss_func`` sums f over the k
    slots, so its value is k times this one.) ``counts``: the assignments per expert when
    known without reading ``ids`` (contiguous routing). ``reduce``: these tokens are one
    share of the call's, the others on ``reduce.ranks`` ranks (context parallelism: each
    rank routes s/cp tokens of every sequence): f over all of them (``reduce`` sums the
    counts), P over this rank's, so the ranks' losses sum to cp times the whole call's,
    which the gradients' average over the cp ranks brings back to one (Megatron-Core's
    load-balancing loss reduces its token counts over its sequence-partition group).
    """
    tokens, k = ids.shape
    load = (expert_counts(ids, experts) if counts is None
            else torch.tensor(counts, device=probs.device))
    if reduce is not None:
        load = reduce(load)
        tokens *= reduce.ranks
    share = load.to(probs.dtype) / (tokens * k)
    return experts * (share * probs.mean(dim=0)).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): mean over tokens of
    logsumexp(logits)^2; keeps the router's logits small. logits [T, E] -> scalar."""
    return torch.logsumexp(logits.to(router_dtype(logits.dtype)), dim=-1).square().mean()


# --- dispatch ---------------------------------------------------------------------------

def permute(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The T*k (token, slot) pairs sorted by expert id, stably (token order within one
    expert). x [T, d], ids [T, k] -> (x_sorted [T*k, d], order [T*k]): row r of x_sorted
    is token ``order[r] // k``."""
    k = ids.shape[1]
    order = torch.argsort(ids.reshape(-1), stable=True)
    return x[order // k], order


def unpermute(y_sorted: torch.Tensor, order: torch.Tensor, weights: torch.Tensor,
              tokens: int) -> torch.Tensor:
    """The inverse of :func:`permute`, combined: out[t] = sum_j weights[t, j] * y[t*k + j].

    y_sorted [N, d] with N <= T*k (rows past N, assignments dropped by capacity and
    sorted last, count as 0), order [T*k], weights [T, k] -> [T, d].
    """
    k, d = weights.shape[1], y_sorted.shape[1]
    missing = order.numel() - y_sorted.shape[0]
    if missing:
        y_sorted = torch.cat([y_sorted, y_sorted.new_zeros(missing, d)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    y = y_sorted[inverse].view(tokens, k, d)  # back in (token, slot) order
    return (y * weights.unsqueeze(-1)).sum(dim=1)


@dataclass
class Routing:
    """One forward's routing of its T tokens (:func:`dispatch`)."""

    tokens: int
    weights: torch.Tensor  # [T, k], zero where capacity dropped the assignment
    counts: torch.Tensor  # LongTensor [E]: assignments per expert, before dropping
    kept: torch.Tensor  # LongTensor [E]: rows each expert takes (after dropping)
    order: torch.Tensor  # [T*k]: (token, slot) pairs sorted by expert id, dropped last
    rows: torch.Tensor  # [sum(kept), d]: the rows the experts take, grouped by expert
    aux: torch.Tensor | None  # coefficient-weighted auxiliary loss, or None
    # Known before the router runs (contiguous routing), else None: read from the tensors.
    static_counts: tuple[int, ...] | None = None
    static_kept: tuple[int, ...] | None = None


def dispatch(tokens: torch.Tensor, logits: torch.Tensor, top_k: int,
             options: MoEOptions, reduce: CountReducer | None = None) -> Routing:
    """Route ``tokens`` [T, d] by the router's ``logits`` [T, E]: top-k (or the forced
    contiguous cycle, ``options.routing``), optional capacity dropping (a dropped
    assignment gets weight 0 and sorts after every expert's rows, so it is never sent),
    the rows grouped by expert, and ``aux_coef`` * load balance + ``z_coef`` * z-loss
    (``reduce``: :func:`load_balance_loss`'s). The one routing of the model, the simulator
    and the expert-parallel runtime."""
    experts, n_tokens = logits.shape[-1], tokens.shape[0]
    static: tuple[int, ...] | None = None
    if options.routing == "contiguous":
        # Every count is known from T, k and E (moe_contiguous): nothing reads the ids.
        ids = contiguous_ids(n_tokens, top_k, experts, logits.device)
        weights = contiguous_weights(logits, ids, router_dtype(logits.dtype))
        static = contiguous_counts(n_tokens, top_k, experts)
        counts = torch.tensor(static, device=logits.device)
    else:
        weights, ids = route(logits, top_k)
        counts = expert_counts(ids, experts)
    sorted_ids, kept = ids, counts
    static_kept = static
    if options.capacity_factor > 0:
        capacity = expert_capacity(n_tokens, top_k, experts, options.capacity_factor)
        keep = (capacity_keep(ids, experts, capacity) if static is None
                else contiguous_keep(n_tokens, top_k, experts, capacity, ids.device))
        weights = weights * keep
        sorted_ids = ids.masked_fill(~keep, experts)
        kept = counts.clamp(max=capacity)  # an expert keeps its first `capacity`
        static_kept = capped(static, capacity) if static is not None else None
    x_sorted, order = permute(tokens, sorted_ids)
    aux = None
    if options.aux_coef:
        probs = F.softmax(logits.to(router_dtype(logits.dtype)), dim=-1)
        aux = options.aux_coef * load_balance_loss(probs, ids, experts, static, reduce)
    if options.z_coef:
        z = options.z_coef * router_z_loss(logits)
        aux = z if aux is None else aux + z
    if static_kept is not None:
        n = sum(static_kept)
    else:
        n = int(kept.sum()) if options.capacity_factor > 0 else x_sorted.shape[0]
    return Routing(n_tokens, weights, counts, kept, order, x_sorted[:n], aux, static,
                   static_kept)


# --- experts ----------------------------------------------------------------------------

def grouped_mlp(x_sorted: torch.Tensor, counts: list[int], w_gate: torch.Tensor | None,
                w_up: torch.Tensor, w_down: torch.Tensor, b_up: torch.Tensor | None = None,
                b_down: torch.Tensor | None = None) -> torch.Tensor:
    """Expert e's MLP on its ``counts[e]`` contiguous rows of x_sorted [N, d] -> [N, d].

    SwiGLU ``(silu(x W_gate) * (x W_up)) W_down`` with w_gate [E, d, f] (llama style), else
    ``gelu_tanh(x W_up + b_up) W_down + b_down`` (gpt style, as the dense MLP). w_up
    [E, d, f], w_down [E, f, d]; b_up [E, f], b_down [E, d]. A loop of matmuls over the
    experts (torch._grouped_mm is CUDA-only); an expert with no rows costs nothing and
    still gets a (zero) gradient.
    """
    # One unbind per weight, not w[e] per expert: select's backward builds a zero gradient of
    # the whole [E, ...] weight for each expert (a dry run of 4 experts of d=512, f=2048
    # held 87.6 MB of such temporaries in one process, 1.74x the experts' fp32 weights);
    # unbind's stacks the experts' gradients once.
    ups, downs = w_up.unbind(0), w_down.unbind(0)
    gates = w_gate.unbind(0) if w_gate is not None else None
    outs = []
    for e, rows in enumerate(x_sorted.split(counts)):  # [counts[e], d]
        h = rows @ ups[e]
        if b_up is not None:
            h = h + b_up[e]
        h = F.silu(rows @ gates[e]) * h if gates is not None else F.gelu(h, approximate="tanh")
        out = h @ downs[e]
        outs.append(out + b_down[e] if b_down is not None else out)
    return torch.cat(outs)


class GroupedExperts(nn.Module):
    """``experts`` MLPs of width ``d_ff`` in grouped weights: ``w_gate`` [E, d, f] (SwiGLU
    only), ``w_up`` [E, d, f], ``w_down`` [E, f, d], and with ``bias`` ``b_up`` [E, f],
    ``b_down`` [E, d] (gpt style), so each expert has :func:`~shardlab.estimate.params.
    mlp_params` parameters. Leading dim E shards over expert-parallel ranks."""

    def __init__(self, experts: int, d_model: int, d_ff: int, *, swiglu: bool, bias: bool,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()

        def param(*size: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*size, dtype=dtype))

        self.w_gate = param(experts, d_model, d_ff) if swiglu else None
        self.w_up = param(experts, d_model, d_ff)
        self.w_down = param(experts, d_ff, d_model)
        self.b_up = param(experts, d_ff) if bias else None
        self.b_down = param(experts, d_model) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, 0.02) weights, zero biases (the model re-draws them from its own seed)."""
        for name, p in self.named_parameters():
            if name.startswith("b_"):
                p.zero_()
            else:
                p.normal_(0.0, INIT_STD)

    def forward(self, x_sorted: torch.Tensor,
                counts: torch.Tensor | tuple[int, ...]) -> torch.Tensor:
        """x_sorted [N, d] grouped by expert, counts (rows each: LongTensor [E], or a
        tuple where known in advance) -> [N, d]."""
        rows = list(counts) if isinstance(counts, tuple) else counts.tolist()
        return grouped_mlp(x_sorted, rows, self.w_gate, self.w_up, self.w_down,
                           self.b_up, self.b_down)


class AttachAuxLoss(torch.autograd.Function):
    """Identity on ``out`` in forward; backward passes ``out``'s gradient through and
    sends gradient 1 into ``aux`` (a scalar already times its coefficient), so
    ``aux`` is added to the objective without being returned (Megatron-LM's
    MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(aux)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (aux,) = ctx.saved_tensors
        return grad, torch.ones_like(aux)


class MoEFeedForward(nn.Module):
    """A MoE layer in place of a block's MLP (see the module docstring).

    ``router`` (Linear d -> E, bias with ``moe.router_bias``), ``experts``
    (:class:`GroupedExperts` over all E; replaceable by an expert-parallel module of the
    same call signature), ``shared`` (one dense :class:`~shardlab.nn.mlp.MLP` of width
    ``shared_experts * shared_d_ff``: the same function as the separate shared experts
    summed, as DeepSeek-V2's code builds them; None without shared experts).

    After each forward: ``last_counts`` (LongTensor [E], assignments per expert before
    dropping; with contiguous routing also ``last_static_counts``, the same as a tuple,
    readable on fake tensors), ``last_dropped`` (assignments dropped by capacity) and
    ``last_aux`` (the weighted auxiliary loss, detached; 0 without coefficients).
    """

    def __init__(self, shape: ModelShape, dtype: torch.dtype = torch.float32, *,
                 aux_coef: float = 0.0, z_coef: float = 0.0,
                 capacity_factor: float = 0.0, routing: str = "learned") -> None:
        super().__init__()
        if shape.moe is None:
            raise SpecError("model", shape.name, "has no mixture-of-experts layers (moe)")
        moe = shape.moe
        self.options = MoEOptions(aux_coef, z_coef, capacity_factor, routing)  # checks each
        self.num_experts, self.top_k = moe.experts, moe.experts_per_token
        self.aux_coef, self.z_coef, self.capacity_factor = aux_coef, z_coef, capacity_factor
        self.router = nn.Linear(shape.d_model, moe.experts, bias=moe.router_bias, dtype=dtype)
        self.experts: nn.Module = GroupedExperts(
            moe.experts, shape.d_model, moe.expert_d_ff, swiglu=shape.style == "llama",
            bias=shape.biases, dtype=dtype)
        self.shared = (MLP(shape, dtype, moe.shared_experts * moe.shared_d_ff)
                       if moe.shared_experts else None)
        self.last_counts = torch.zeros(moe.experts, dtype=torch.long)
        self.last_static_counts: tuple[int, ...] | None = None
        self.last_dropped = 0
        self.last_aux = torch.zeros(())
        # Set by context parallelism (shardlab.distributed.context_parallel.apply_cp): the
        # load-balancing loss's counts summed over the ranks sharing each sequence.
        self.count_reducer: CountReducer | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, s, d] -> [b, s, d]."""
        b, s, d = x.shape
        tokens = x.reshape(-1, d)  # [T, d]
        r = dispatch(tokens, self.router(tokens), self.top_k, self.options,
                     self.count_reducer)
        self.last_counts, self.last_static_counts = r.counts.detach(), r.static_counts
        self.last_dropped = r.order.numel() - r.rows.shape[0]
        kept = r.static_kept if r.static_kept is not None else r.kept
        y = unpermute(self.experts(r.rows, kept), r.order, r.weights, r.tokens)
        if self.shared is not None:
            y = y + self.shared(tokens)
        self.last_aux = (r.aux.detach() if r.aux is not None
                         else torch.zeros((), device=y.device))
        if r.aux is not None and r.aux.requires_grad:
            y = AttachAuxLoss.apply(y, r.aux)
        return y.view(b, s, d)
