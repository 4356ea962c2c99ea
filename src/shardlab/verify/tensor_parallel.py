"""Tensor parallelism with torch's own plans equals the unsharded module, in float64.

Two modules of a small llama-style :class:`~shardlab.config.model.ModelShape` (RMSNorm
world, SwiGLU MLP, rotary positions, grouped-query attention) are sharded over a 1-D
mesh of every rank (``torch.distributed.device_mesh.init_device_mesh``) with
``torch.distributed.tensor.parallel.parallelize_module``:

* shardlab's :class:`~shardlab.nn.model.MLP`: ``gate_proj`` and ``up_proj`` with
  ``ColwiseParallel`` (each rank holds ``d_ff / world`` output features, so the SwiGLU
  product is computed on its own columns with no communication), ``down_proj`` with
  ``RowwiseParallel`` (each rank holds the matching ``d_ff / world`` input features;
  the partial sums are all-reduced into a replicated output).
* shardlab's :class:`~shardlab.nn.model.Attention`: ``q_proj``, ``k_proj``,
  ``v_proj`` with ``ColwiseParallel`` and ``o_proj`` with ``RowwiseParallel``, all
  with ``use_local_output=True``. The q/k/v outputs are then plain per-rank tensors
  of ``heads / world`` query heads and ``kv_heads / world`` key/value heads, and
  :func:`~shardlab.nn.model.attend` (which views by ``head_dim`` and takes the head
  count from the tensor) runs attention on the rank's own heads only. Because the
  projections are head-major and ``heads / kv_heads`` query heads share a kv head,
  rank r's query heads use exactly rank r's kv heads; that is why both head counts
  must be divisible by the world size (2·world heads and world kv heads are used).

Each sharded module starts from a copy of the unsharded module's parameters (the
same seeded init) and sees the same replicated input; the checks compare, in
float64 with tolerance 1e-10, the output, the input's gradient and every weight
gradient (sharded ``DTensor`` gradients gathered with ``full_tensor()``) with the
unsharded module on the same rank, and take the worst difference over ranks. They
also check the placements (``Shard(0)`` for column-wise, ``Shard(1)`` for row-wise
weights: ``nn.Linear.weight`` is [out, in]) and the local shard shapes, the number of
heads each rank projects, and the collectives
``torch.distributed.tensor.debug.CommDebugMode`` counts: forward one ``all_reduce``
(the row-parallel output, Partial -> Replicate); backward one ``all_reduce`` per
column-parallel linear (each turns its replicated input's Partial gradient back into
Replicate), so two for the MLP and three for attention, not the single all-reduce of
Megatron-LM's hand-written ``f`` operator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from shardlab.config.model import ModelShape
from shardlab.distributed.launch import RankContext
from shardlab.nn.model import MLP, Attention, attention_mask, rope_tables
from shardlab.verify.registry import check

DTYPE = torch.float64
TOLERANCE = 1e-10  # float64: sharded and unsharded differ only by summation order
SEED = 2024
BATCH, SEQ = 2, 8


def toy_shape(world: int) -> ModelShape:
    """A llama-style shape whose heads (2·world), kv heads (world) and d_ff split evenly."""
    return ModelShape(name="tp-toy", layers=1, d_model=32, heads=2 * world, kv_heads=world,
                      head_dim=8, d_ff=16 * world, vocab=64, context=SEQ, style="llama",
                      tied=False)


@torch.no_grad()
def seeded_(module: nn.Module, seed: int) -> nn.Module:
    """Fill every parameter from a private generator: N(0, 1/fan_in) weights, unit norms."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if "norm" in name:
            p.fill_(1.0)
        else:
            w = torch.randn(p.shape, generator=gen, dtype=torch.float64) * p.shape[-1] ** -0.5
            p.copy_(w)
    return module


def _worst(values: list[float], device: str) -> list[float]:
    """Each value's maximum over ranks (one all-reduce), so rank 0 reports the worst."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _counts(mode: Any) -> dict[str, int]:
    """CommDebugMode's per-collective counts, keyed by the op's short name."""
    return {str(op).split(".")[-1]: int(n) for op, n in mode.get_comm_counts().items()}


def _compare(ctx: RankContext, mesh: Any, make: Callable[[], nn.Module], seed: int,
             plan: dict[str, Any], forward: Callable[[nn.Module, torch.Tensor], torch.Tensor],
             x: torch.Tensor, probe: torch.Tensor) -> dict[str, Any]:
    """Build ``make()`` twice with the same parameters, shard one with ``plan``, run both.

    Returns the output, input-gradient and per-weight-gradient differences, the sharded
    weights' placements and local shapes, and the collectives counted in forward and in
    backward of the sharded module.
    """
    ref = seeded_(make(), seed).to(ctx.device)
    tp = make().to(ctx.device)
    tp.load_state_dict(ref.state_dict())
    parallelize_module(tp, mesh, plan)

    x_ref = x.clone().requires_grad_(True)
    x_tp = x.clone().requires_grad_(True)
    out_ref = forward(ref, x_ref)
    (out_ref * probe).sum().backward()
    fwd, bwd = CommDebugMode(), CommDebugMode()
    with fwd:
        out_tp = forward(tp, x_tp)
    with bwd:
        (out_tp * probe).sum().backward()

    grads: dict[str, float] = {}
    placements: dict[str, str] = {}
    local_shapes: dict[str, tuple[int, ...]] = {}
    full_shapes: dict[str, tuple[int, ...]] = {}
    for name, p in tp.named_parameters():
        ref_grad = ref.get_parameter(name).grad
        full_shapes[name] = tuple(ref_grad.shape)
        if not (isinstance(p, DTensor) and isinstance(p.grad, DTensor)):
            grads[name], placements[name] = float("inf"), "not a DTensor"
            continue
        grads[name] = (p.grad.full_tensor() - ref_grad).abs().max().item()
        placements[name] = str(p.placements[0])
        local_shapes[name] = tuple(p.to_local().shape)
    return {
        "tp": tp, "out_plain": not isinstance(out_tp, DTensor),
        "out": (out_tp - out_ref).abs().max().item(),
        "x_grad": (x_tp.grad - x_ref.grad).abs().max().item(),
        "grads": grads, "placements": placements, "local_shapes": local_shapes,
        "full_shapes": full_shapes,
        "fwd_comms": _counts(fwd), "bwd_comms": _counts(bwd),
    }


def _checks(prefix: str, ctx: RankContext, r: dict[str, Any], colwise: list[str],
            rowwise: list[str], expected_fwd: dict[str, int],
            expected_bwd: dict[str, int]) -> list[dict[str, object]]:
    """Turn one comparison into checks; numeric diffs are the worst over ranks."""
    names = sorted(r["grads"])
    worst = _worst([r["out"], r["x_grad"], *(r["grads"][n] for n in names)], ctx.device)
    out, x_grad, grads = worst[0], worst[1], dict(zip(names, worst[2:], strict=True))
    world = ctx.world_size
    want = {f"{m}.weight": "S(0)" for m in colwise} | {f"{m}.weight": "S(1)" for m in rowwise}
    got = {n: r["placements"][n] for n in want}
    want_shapes = {}
    for n, placement in want.items():
        out_f, in_f = r["full_shapes"][n]
        want_shapes[n] = (out_f // world, in_f) if placement == "S(0)" else (out_f, in_f // world)
    got_shapes = {n: r["local_shapes"].get(n) for n in want}
    comms = (f"forward {r['fwd_comms']} (expected {expected_fwd}), backward "
             f"{r['bwd_comms']} (expected {expected_bwd})")
    return [
        check(f"{prefix}_output_max_abs_diff", out, TOLERANCE,
              f"float64; output a plain tensor: {r['out_plain']}", passed=out <= TOLERANCE
              and r["out_plain"]),
        check(f"{prefix}_input_grad_max_abs_diff", x_grad, TOLERANCE, "float64"),
        check(f"{prefix}_weight_grad_max_abs_diff", max(grads.values()), TOLERANCE,
              "float64, full_tensor() of each DTensor grad vs unsharded: "
              + ", ".join(f"{n}={v:.2e}" for n, v in grads.items())),
        check(f"{prefix}_placements", 0.0 if (got, got_shapes) == (want, want_shapes) else 1.0,
              0.0, f"{got}; local shapes {got_shapes} (expected {want_shapes})"),
        check(f"{prefix}_collectives", 0.0 if (r["fwd_comms"], r["bwd_comms"])
              == (expected_fwd, expected_bwd) else 1.0, 0.0, "CommDebugMode: " + comms),
    ]


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """Shard shardlab's MLP and Attention with Colwise/RowwiseParallel; compare with one rank.

    Writes nothing under ``work_dir``.
    """
    del work_dir
    world = ctx.world_size
    mesh = init_device_mesh(torch.device(ctx.device).type, (world,))
    shape = toy_shape(world)
    gen = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(BATCH, SEQ, shape.d_model, generator=gen, dtype=DTYPE).to(ctx.device)
    probe = torch.randn(BATCH, SEQ, shape.d_model, generator=gen, dtype=DTYPE).to(ctx.device)
    checks: list[dict[str, object]] = []

    mlp_plan = {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(),
                "down_proj": RowwiseParallel()}
    r = _compare(ctx, mesh, lambda: MLP(shape, DTYPE), SEED, mlp_plan, lambda m, t: m(t),
                 x, probe)
    # One all-reduce of the row-parallel output in forward. In backward each
    # column-parallel linear all-reduces its own share of the input's gradient (its
    # Replicate input turns a Partial gradient back into Replicate): two, for gate and
    # up, where Megatron's hand-written f would sum them first and all-reduce once.
    checks += _checks("mlp", ctx, r, ["gate_proj", "up_proj"], ["down_proj"],
                      {"all_reduce": 1}, {"all_reduce": 2})

    local = {"use_local_output": True}
    attn_plan = {"q_proj": ColwiseParallel(**local), "k_proj": ColwiseParallel(**local),
                 "v_proj": ColwiseParallel(**local), "o_proj": RowwiseParallel(**local)}
    pad = torch.ones(BATCH, SEQ, dtype=torch.bool, device=ctx.device)
    pad[1, SEQ - 3:] = False  # right padding on the second sequence
    mask = attention_mask(pad, SEQ, torch.device(ctx.device))
    rope = tuple(t.to(ctx.device) for t in rope_tables(SEQ, shape.head_dim, DTYPE))

    def attn_forward(m: nn.Module, t: torch.Tensor) -> torch.Tensor:
        return m(t, mask, rope)

    r = _compare(ctx, mesh, lambda: Attention(shape, DTYPE), SEED + 2, attn_plan,
                 attn_forward, x, probe)
    # Likewise q, k and v each all-reduce their share of the input gradient in backward.
    checks += _checks("attention", ctx, r, ["q_proj", "k_proj", "v_proj"], ["o_proj"],
                      {"all_reduce": 1}, {"all_reduce": 3})
    with torch.no_grad():
        q_heads = r["tp"].q_proj(x).shape[-1] // shape.head_dim
        kv_heads = r["tp"].k_proj(x).shape[-1] // shape.head_dim
    own = (q_heads, kv_heads) == (shape.heads // world, shape.kv_heads // world)
    checks.append(check("attention_local_heads", 0.0 if own else 1.0, 0.0,
                        f"rank {ctx.rank} projects {q_heads} of {shape.heads} query heads and "
                        f"{kv_heads} of {shape.kv_heads} kv heads (world {world})"))

    # A 1-D mesh over every rank reuses the default group; destroy one made for it.
    if mesh.get_group() is not dist.group.WORLD:
        dist.destroy_process_group(mesh.get_group())
    return checks
