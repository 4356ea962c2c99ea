"""One transformer layer's forward on one rank, in seconds, vectorised over layouts: the
matmuls (each at its own shape's efficiency, :mod:`shardlab.plan.efficiency`), the
attention core, the matmuls a framework's per-operator checkpointing runs again, and the
matmul beside each tensor-parallel collective (what a decomposed collective can hide
behind: :func:`shardlab.plan.overlap.tp_exposed`).

The matmuls are timed as Megatron-LM shapes them (q, k and v one [T, h] x [h, (q + 2kv)/t]
matmul, the gated MLP's gate and up one of width 2f/t); the ones per-operator
checkpointing recomputes are timed one by one, as torchtitan calls them.

Used by :mod:`shardlab.plan.step_time`, which multiplies them out over layers,
micro-batches and passes (backward = 2 x forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.config.hardware import OPS_PER_LAYER_FORWARD
from shardlab.config.model import ModelShape
from shardlab.estimate.activations import op_checkpoint_saves
from shardlab.estimate.context import causal_imbalance
from shardlab.plan.efficiency import fraction_of_peak, matmul_seconds
from shardlab.plan.expert_time import kept_rows, routed_tokens
from shardlab.plan.memory_bound import layer_elementwise_elements
from shardlab.plan.space import Candidates
from shardlab.plan.step_inputs import Device


@dataclass(frozen=True)
class LayerForward:
    """Seconds of one layer's forward on one tp rank, per layout: ``matmul`` (every linear
    matmul, the router and the launch costs), ``core`` (the attention core) and
    ``op_recompute`` (the linear matmuls that per-operator selective checkpointing runs
    again: :func:`op_checkpoint_matmuls`)."""

    matmul: np.ndarray
    core: np.ndarray
    op_recompute: np.ndarray
    tp_windows: tuple[np.ndarray, ...] = ()
    """The forward seconds of the matmul beside each of the layer's four tensor-parallel
    collectives (sequence parallel's all-gather before q, k, v; reduce-scatter after the
    output projection; all-gather before the MLP's first matmul(s); reduce-scatter after
    its last): the only compute a decomposed collective can ride alongside."""
    up_proj: np.ndarray | float = 0.0
    """Latent attention's up projections (query and key/value), the matmuls Megatron-Core's
    ``mla_up_proj`` recompute runs again; 0 without latent attention."""


def op_checkpoint_matmuls(model: ModelShape) -> tuple[bool, ...]:
    """Which of a dense block's linear matmuls, in the order its forward calls them (q, k,
    v, output; then gate, up, down for a gated MLP or up, down), torchtitan's per-operator
    selective checkpointing runs again in backward: those whose outputs it does not save
    (:func:`shardlab.estimate.activations.op_checkpoint_saves`), so the 2nd, 4th and 6th:
    k, output and up (SwiGLU) or k, output and down (a two-matrix MLP)."""
    return tuple(not saved for saved in op_checkpoint_saves(model))


def layer_forward(model: ModelShape, seq: int, tp: np.ndarray, mb: np.ndarray, dev: Device,
                  moe_layer: bool, c: Candidates | None = None, flash: bool = False,
                  kernel: str = "fa3", cp: np.ndarray | int = 1,
                  balance: np.ndarray | float = 1.0,
                  expert_launches: bool = False) -> LayerForward:
    """One layer's forward on one tp rank of a cp rank (its b·s/cp tokens; a MoE layer's
    experts as ``c``'s ep, etp and capacity factor place them); the linear layers at
    ``linear_peak``, the router and the core at ``peak`` (the core of an fp8 kernel,
    ``kernel="fp8"``, at ``linear_peak``); ``balance``: the causal load
    balance, busiest cp rank's attention over the mean's."""
    m = model
    t = tp.astype(float)
    queries = seq / np.asarray(cp, float)  # a cp rank's tokens of each sequence
    tokens = mb * queries
    h, q, kv = m.d_model, m.q_dim, m.kv_dim
    mm = m.mlp_matrices
    lin = dev.linear_peak or dev.peak
    lin_eff = dev.eff.fp8_curve() if dev.linear_peak else dev.eff

    def mat(rows: np.ndarray | float, k: np.ndarray | float, n: np.ndarray | float,
            linear: bool = True) -> np.ndarray:
        return matmul_seconds(2.0 * rows * k * n, rows, k, n, lin if linear else dev.peak,
                              lin_eff if linear else dev.eff)

    out = mat(tokens, m.o_dim / t, h)
    up_proj: np.ndarray | float = 0.0
    if m.mla is None:
        qkv = mat(tokens, h, (q + 2 * kv) / t)
        # The block's linear matmuls one by one, in call order (q, k, v, output, then the
        # MLP's), for the ones per-operator checkpointing runs again.
        calls = [mat(tokens, h, q / t), mat(tokens, h, kv / t), mat(tokens, h, kv / t), out]
    else:
        # Latent attention: each projection on its own; a duplicated down projection runs
        # whole, on the rank's s/t tokens under sequence parallelism (Megatron-LM's MLA),
        # on all of them without.
        local = np.where(c.sp, t, 1.0) if c is not None else 1.0
        calls = [mat(tokens / local, x.d_in, x.d_out) if x.split == "duplicated"
                 else mat(tokens, x.d_in, x.d_out / t) for x in m.attention_linears[:-1]]
        qkv = sum(calls[1:], calls[0])
        # The column-parallel projections mla_up_proj reruns: the query's (up, or the whole
        # one without a query latent) and the key/value up projection.
        up_proj = sum(x for x, a in zip(calls, m.attention_linears, strict=False)
                      if a.split == "column")
        calls.append(out)
    secs = qkv + out
    again = op_checkpoint_matmuls(m)
    attn_calls = len(m.attention_linears)
    if moe_layer and m.moe is not None:
        assert c is not None
        e = m.moe
        # Routed experts: the rank's E/ep experts, each on the ep·T·k/E rows it receives
        # (balanced, capped by capacity), at width f/etp.
        ep, etp = c.ep.astype(float), c.etp.astype(float)
        per_expert = ep * kept_rows(m, routed_tokens(c, seq), c.capacity_factor) / e.experts
        f = e.expert_d_ff / etp
        mlp_in = e.experts / ep * mat(per_expert, h, (mm - 1) * f)
        mlp_out = e.experts / ep * mat(per_expert, f, h)
        experts = mlp_in + mlp_out
        if e.shared_experts:
            width = e.shared_experts * e.shared_d_ff
            mlp_in = mlp_in + mat(tokens, h, (mm - 1) * width / t)
            mlp_out = mlp_out + mat(tokens, width / t, h)
        secs = secs + mlp_in + mlp_out + mat(tokens, h, float(e.experts), linear=False)
        # The experts' grouped matmuls are no aten.mm: the policy runs them all again.
        redo = sum(x for x, r in zip(calls, again[:attn_calls], strict=True) if r) + experts
    else:
        mlp_in, mlp_out = mat(tokens, h, (mm - 1) * m.d_ff / t), mat(tokens, m.d_ff / t, h)
        secs = secs + mlp_in + mlp_out
        calls += [mat(tokens, h, m.d_ff / t)] * (mm - 1) + [mat(tokens, m.d_ff / t, h)]
        redo = sum(x for x, r in zip(calls, again, strict=True) if r)
    # Attention core: Q·Kᵀ and scores·V per sequence and head, [s/cp, hd] x [hd, s] (the
    # sum at the value's width under latent attention: 2·(s/cp)·s·(q + o)); a
    # fused (flash) kernel keeps the scores on chip, so it moves only Q, O (s/cp tokens)
    # and K, V (s): 4·(s/cp)·s·hd FLOPs over 2·(s/cp + s)·hd 2-byte elements, an intensity
    # of s/(cp + 1) (s/2 without cp).
    core_flops = 2.0 * tokens * seq * (q + m.o_dim) / t * balance
    if flash:
        # An fp8 kernel runs against the fp8 peak on the fp8 curve (its cap a share of that).
        fp8_core = kernel == "fp8"
        if fp8_core and not dev.linear_peak:
            raise ValueError("an fp8 attention kernel needs an fp8 policy's linear peak")
        peak, eff = (lin, lin_eff) if fp8_core else (dev.peak, dev.eff)
        cap = dict(dev.eff.flash_fractions).get(kernel, 1.0)
        intensity = queries * seq / (queries + seq)
        core = core_flops / (peak * np.minimum(fraction_of_peak(intensity, eff), cap))
    else:
        core = matmul_seconds(core_flops, queries, m.head_dim, seq, dev.peak, dev.eff)
    ops: np.ndarray | float = OPS_PER_LAYER_FORWARD
    if moe_layer and m.moe is not None:
        # In place of the dense MLP's three operators: the experts' two matmuls, the
        # router's matmul and top-k, the permute, the activation and the unpermute. The
        # experts' matmuls are one grouped kernel each (torch._grouped_mm), or with
        # ``expert_launches`` one GEMM per local expert (Megatron-Core's Transformer Engine
        # experts: Framework.expert_launches).
        grouped = 2 * m.moe.experts / c.ep.astype(float) if expert_launches else 2.0
        ops = OPS_PER_LAYER_FORWARD - 3 + grouped + 5
    secs = secs + ops * dev.eff.op_overhead
    windows = tuple(np.asarray(x, float) + 0.0 * t for x in (qkv, out, mlp_in, mlp_out))
    return LayerForward(np.asarray(secs, float), np.asarray(core, float),
                        np.asarray(redo, float) + 0.0 * t, windows, up_proj + 0.0 * t)


def cp_balance(seq: int, cp: np.ndarray) -> np.ndarray:
    """The causal load balance per layout (:func:`shardlab.estimate.context.causal_imbalance`
    of the zigzag chunks: 1), per distinct cp."""
    uniq, inv = np.unique(cp, return_inverse=True)
    return np.array([causal_imbalance(seq, int(x)) if seq % (2 * x) == 0 else 1.0
                     for x in uniq])[inv.ravel()]


def probe_elementwise_bandwidth(probe: dict[str, float], dev: Device, flash: bool = True
                                ) -> float | None:
    """The rate (bytes/s) at which this machine's memory-bound operators move the bytes the
    model counts, from one layer timed forward + backward on one thread (``probe``, see
    :mod:`shardlab.calibrate.cpu`): the measured seconds less the model's matmul and
    attention-core time for that layer (3 x forward), over the model's memory-bound bytes
    (forward + twice that in backward, fp32). Eager RMSNorm, rotary embedding and SwiGLU
    make several passes over what the operator table counts once, so this is well below
    the copy bandwidth. None when the matmuls alone take the measured time."""
    shape = ModelShape("probe", 1, int(probe["d_model"]), int(probe["heads"]), vocab=16,
                       context=int(probe["seq"]), style="llama", tied=False,
                       d_ff=int(probe["d_ff"]))
    one = np.ones(1, dtype=np.int64)
    batch = one * int(probe["batch"])
    layer = layer_forward(shape, int(probe["seq"]), one, batch, dev, moe_layer=False)
    elements, _ = layer_elementwise_elements(shape, int(probe["seq"]), one, batch,
                                             np.zeros(1, bool), flash)
    left = probe["seconds"] - 3 * float((layer.matmul + layer.core)[0])
    if left <= 0:
        return None
    return 3 * float(elements[0]) * 4 / left
