"""fp8 training: which matmuls run in fp8, what the casts move, what the fp8 copies hold.

The split (the ``fp8`` policy of :mod:`shardlab.config.dtypes`) is Transformer Engine's
and torchao's float8 training: every linear layer of the attention projections (Q, K, V,
output), the MLP and the experts (routed and shared) multiplies in fp8, forward (E4M3)
and backward (E5M2 gradients); the attention core (Q·Kᵀ, scores·V), the output head
(torchtitan's float8 converter skips ``output``), the MoE router and the norms stay in
bf16. The DeepSeek-V3 report (arXiv 2412.19437, Sec. 3.3.1) states the same: "the
embedding module, the output head, MoE gating modules, normalization operators, and
attention operators" keep their precision, the three GEMMs of each linear run in fp8.

**Casts** (memory-bound, at the memory bandwidth, per layer and micro-batch): each
bf16 operand of an fp8 GEMM is scanned for its absolute maximum (read 2 B per element:
dynamic/current scaling, torchao's tensorwise default), cast (read 2 B, write 1 B) and,
for the transposed operand Hopper's fp8 GEMM needs in backward, transposed (read 1 B,
write 1 B): :data:`ACTIVATION_CAST_BYTES` = 7 B per element of every linear's input
(forward) and of every linear's output gradient (backward), torchao's separate kernels.
Transformer Engine fuses the cast into the kernel that produces the operand (its
LayerNormLinear and LayerNormMLP modules; delayed scaling takes the amax in the same
pass), leaving the write of the fp8 copy and the transpose: 3 B (the framework's
``fp8_cast_bytes``, :mod:`shardlab.plan.overlap`), with delayed scaling. The recipe a
Transformer Engine run names (``fp8_recipe``: :data:`RECIPE_CAST_BYTES`) changes that, as
its quantizers' code paths do (transformer_engine/pytorch/csrc/extensions normalization.cpp
and activation.cpp, Transformer Engine 2.x as the search tool holds it; the commit was not
recorded): delayed scaling writes the fp8 copy from the norm or activation kernel
itself (``Impl::FULLY_FUSED``, ``FUSED_DACT_DBIAS_QUANTIZE``), 1 B and a 2 B transpose,
and casts any other operand with its amax in one cast-transpose pass (read 2 B, write 1 + 1
B): 3-4 B, 3 priced; current (tensorwise) scaling cannot scale before it has the amax, so
the norm and activation kernels write bf16 beside their amax (``FUSED_NORM_AMAX_FP8``,
``FUSED_DACT_AMAX_FP8``) and a cast-transpose pass follows (4 B), and any other operand
gets an amax pass first (2 B more, 6 B): 5 priced, the middle; MXFP8 scales each block of
32 as it casts, so no amax pass, but its norm is unfused (a bf16 write, then a 4 B
cast of rows and columns, scales 1 B a block of 32 each way): 4 priced. With
``NVTE_NORM_FWD_USE_CUDNN`` set (Megatron-Bridge's scripts set it for some runs) cuDNN's
norm writes MXFP8 itself and current scaling's norm is not fused at all; not priced per
run. The priced figures were picked after their effect on the held-out runs was seen
(docs/validation.md, eleventh revision). Weights are cast without
the amax pass (their scale is precomputed: torchao ``precompute_float8_dynamic_scale_for_
fsdp``, Transformer Engine's cached weight): :data:`WEIGHT_CAST_BYTES` = 5 B per weight
element per micro-batch. With sequence parallelism the column-parallel inputs are cast
before their all-gather (torchao ``Float8ColwiseParallel``, Transformer Engine's fp8
all-gather), on T·h/t elements. The planner's step time keeps those all-gathers at bf16
bytes (1 byte was tried and left out: docs/validation.md); ``train``'s report counts
them at 1 byte (:func:`shardlab.estimate.comm_dtensor.fp8_block_bytes`).

**Memory**: a rank that holds whole weights (ZeRO 0-2) keeps an fp8 copy of each linear
weight and its transpose (``fp8_copy_bytes`` = 2 per element) and, per linear module,
the fp32 scale, inverse scale and amax of its three operands (input, weight, output
gradient; amax history 1, Megatron-LM's ``--fp8-amax-history-len`` default):
:data:`SCALE_BYTES_PER_LINEAR` = 36 B. Under ZeRO-3 the weights are gathered in fp8 layer
by layer and freed, as FSDP's bf16 copies are (not counted, like them).
"""

from __future__ import annotations

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.expert import layout_moe_layers
from shardlab.estimate.flops import flops_per_token
from shardlab.estimate.partition import layout_rank_layers

ACTIVATION_CAST_BYTES = 7
RECIPE_CAST_BYTES: dict[str, int] = {"delayed": 3, "tensorwise": 5, "mxfp8": 4}
"""Bytes a Transformer Engine fp8 operand's cast moves per element, by the recipe a run
names (``fp8_recipe``; module docstring): delayed scaling (Megatron-LM's default
``--fp8-recipe``), current (tensorwise) scaling, MXFP8."""
WEIGHT_CAST_BYTES = 5
SCALE_BYTES_PER_LINEAR = 36


FP8_DIM_MULTIPLE = 16
"""fp8's ``torch._scaled_mm`` takes a matmul only when both of a weight's dimensions are
multiples of 16; shardlab's fp8 filter (:func:`shardlab.train.fp8.fp8_linear`, as
torchtitan's float8 converter filters) leaves any other linear in bf16."""


def fp8_matmul_fits(rows: int, width: int) -> bool:
    """Whether a linear weight of ``rows`` x ``width`` (out x in) can multiply in fp8."""
    return rows % FP8_DIM_MULTIPLE == 0 and width % FP8_DIM_MULTIPLE == 0


ROW_PARALLEL_LINEARS = ("attn.o_proj", "mlp.down_proj")
"""A dense block's linears that tensor parallelism splits on their input width (the rest:
on their output width), by ``shardlab train``'s module names."""


def tp_fp8_linears(m: ModelShape, tp: int, moe_layer: bool = False) -> frozenset[str]:
    """The block linears ``train --dtype fp8`` runs in fp8 on ``tp`` tensor-parallel ranks:
    those whose per-rank matmul (out x in, the split width over tp) both dimensions of
    which :func:`fp8_matmul_fits` (``shardlab.train.fp8.fp8_linear``'s rule), named as the
    block's modules (``attn.q_proj``, ..., ``mlp.down_proj``; ``mlp.gate_proj`` in a llama
    block). A MoE block (``moe_layer``) has its shared experts' MLP
    (``mlp.shared.up_proj``, ..., of width shared_experts x shared_d_ff) in place of the
    dense one, or none: its router and routed experts stay bf16."""
    return frozenset(tp_fp8_weights(m, tp, moe_layer))


def tp_fp8_weights(m: ModelShape, tp: int, moe_layer: bool = False) -> dict[str, tuple[int, int]]:
    """The weights of :func:`tp_fp8_linears` as one tensor-parallel rank holds them, by
    name: (rows, row width) of torch's [out, in], a column-parallel one's rows and a
    row-parallel one's width split over ``tp``."""
    mlp, width = "mlp.", m.d_ff
    if moe_layer:
        assert m.moe is not None
        mlp, width = "mlp.shared.", m.moe.shared_experts * m.moe.shared_d_ff
    shapes = {"attn.q_proj": (m.q_dim, m.d_model), "attn.k_proj": (m.kv_dim, m.d_model),
              "attn.v_proj": (m.kv_dim, m.d_model), "attn.o_proj": (m.d_model, m.q_dim)}
    if width:
        shapes |= {mlp + "up_proj": (width, m.d_model), mlp + "down_proj": (m.d_model, width)}
        if m.style == "llama":
            shapes[mlp + "gate_proj"] = (width, m.d_model)
    local = {name: tp_rank_shape(name, out, inp, tp) for name, (out, inp) in shapes.items()}
    return {name: rows for name, rows in local.items() if fp8_matmul_fits(*rows)}


def row_parallel(name: str) -> bool:
    """Whether the block linear ``name`` is split on its input width
    (:data:`ROW_PARALLEL_LINEARS`, a MoE block's shared experts' down projection too)."""
    return name.rsplit(".", 1)[-1] in {n.rsplit(".", 1)[-1] for n in ROW_PARALLEL_LINEARS}


def tp_rank_shape(name: str, out: int, inp: int, tp: int) -> tuple[int, int]:
    """(out, in) of the matmul one of ``tp`` ranks runs for the block linear ``name``: a
    row-parallel one's input width split, another's output width."""
    return (out, inp // tp) if row_parallel(name) else (out // tp, inp)


def prepared_inputs(m: ModelShape, fp8: frozenset[str]) -> tuple[bool, bool]:
    """Whether the attention's and the MLP's input are cast to fp8 once, at the module,
    under tensor parallelism: every linear reading it is in ``fp8`` (torchao's
    ``PrepareFloat8ModuleInput``, :func:`shardlab.distributed.tensor_parallel.block_plan`).
    In a MoE block (its shared experts' linears, ``mlp.shared.*``, in ``fp8``) the second
    is the shared experts' copy, cast at ``mlp.shared``: the MLP input itself stays bf16
    (its router reads it)."""
    prefix = "mlp.shared." if any(n.startswith("mlp.shared.") for n in fp8) else "mlp."
    mlp = {prefix + "up_proj"} | ({prefix + "gate_proj"} if m.style == "llama" else set())
    return {"attn.q_proj", "attn.k_proj", "attn.v_proj"} <= fp8, mlp <= fp8


def linear_weights(m: ModelShape, tp: int, moe_layer: bool, ep: int = 1,
                   etp: int | None = None) -> int:
    """Linear-layer weight elements of one layer on one tensor-parallel rank: Q, K, V and
    output over tp (latent attention's down projections whole), the MLP over tp, or (MoE)
    the shared experts over tp and the rank's experts/ep routed experts over etp (default
    tp). No router, no biases, no norms."""
    h = m.d_model
    n = sum(x.d_in * x.d_out // (1 if x.split == "duplicated" else tp)
            for x in m.attention_linears)
    if moe_layer and m.moe is not None:
        e = m.moe
        n += m.mlp_matrices * h * e.shared_experts * e.shared_d_ff // tp
        n += e.experts // ep * m.mlp_matrices * h * e.expert_d_ff // (tp if etp is None else etp)
    else:
        n += m.mlp_matrices * h * m.d_ff // tp
    return n


def linear_modules(m: ModelShape, moe_layer: bool, ep: int = 1) -> int:
    """Linear modules of one layer on one rank: fused QKV, output, and two per MLP (the
    gate and up projections fused, then down) and per routed expert the rank holds."""
    if moe_layer and m.moe is not None:
        return 2 + 2 * (1 if m.moe.shared_experts else 0) + 2 * (m.moe.experts // ep)
    return 4


def layer_state_bytes(m: ModelShape, policy: DtypePolicy, tp: int, moe_layer: bool,
                      ep: int = 1, etp: int | None = None) -> float:
    """Bytes one layer's fp8 copies and scales hold on one rank whose weights are whole
    (ZeRO 0-2; module docstring); 0 for a policy without fp8."""
    if not policy.is_fp8:
        return 0.0
    return float(policy.fp8_copy_bytes * linear_weights(m, tp, moe_layer, ep, etp)
                 + SCALE_BYTES_PER_LINEAR * linear_modules(m, moe_layer, ep))


def rank_state_bytes(m: ModelShape, lay: Layout) -> list[float]:
    """fp8 copy and scale bytes on each pipeline rank (0 under ZeRO-3 or without fp8)."""
    if not lay.dtype.is_fp8 or lay.zero >= 3:
        return [0.0] * lay.pp
    dense = layer_state_bytes(m, lay.dtype, lay.tp, False)
    moe = layer_state_bytes(m, lay.dtype, lay.tp, True, lay.ep, lay.etp)
    return [(n - k) * dense + k * moe
            for n, k in zip(layout_rank_layers(m, lay), layout_moe_layers(m, lay),
                            strict=True)]


def mean_width(m: ModelShape) -> float:
    """MLP width a token passes through, averaged over the layers (MoE: top-k experts and
    the shared ones)."""
    if m.moe is None or not m.moe_layers:
        return float(m.d_ff)
    e = m.moe
    width = e.experts_per_token * e.expert_d_ff + e.shared_experts * e.shared_d_ff
    return (m.moe_layers * width + m.dense_layers * m.d_ff) / m.layers


def attention_cast_widths(m: ModelShape, t: np.ndarray, sp: np.ndarray | bool
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) elements per token the attention's fp8 casts read on one tensor-
    parallel rank: the block's input once (h, h/t with sequence parallelism) and every other
    linear's input (a row-parallel one split by t, an up projection's latent whole); the
    gradient of every linear's output (column-parallel over t, a duplicated down projection
    over t only with sequence parallelism, the row-parallel output whole). Without latent
    attention: (h/t or h) + q/t forward, (q + 2kv)/t + h backward."""
    local = np.where(sp, t, 1.0)
    inputs = m.d_model / local + 0.0 * t
    grads = 0.0 * t
    for x in m.attention_linears:
        if not x.reads_input:
            inputs = inputs + (x.d_in / t if x.split == "row" else float(x.d_in))
        grads = grads + (x.d_out / t if x.split == "column"
                         else x.d_out / local if x.split == "duplicated" else float(x.d_out))
    return inputs, grads


def cast_bytes(m: ModelShape, tokens: np.ndarray | float, tp: np.ndarray | float,
               sp: np.ndarray | bool, weights: np.ndarray | float,
               per_element: int = ACTIVATION_CAST_BYTES,
               mlp_copies: np.ndarray | float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) bytes one layer's fp8 casts move on one rank per micro-batch of
    ``tokens`` tokens (module docstring), ``weights`` its linear weight elements.
    Forward: the inputs of QKV and the MLP's first linear (T·h, T·h/t with sequence
    parallelism) and of the output and down projections (T·q/t, T·f/t), plus the weights;
    backward: the gradients of the four outputs (T·(q+2kv)/t, T·h, T·(mm-1)·f/t, T·h).
    ``mlp_copies``: the copies of each token the MLP's first linear reads and its last
    writes (1; a MoE layer's routed experts quantize each of a token's k permuted rows,
    plus one for a shared expert), averaged over the layers."""
    t = np.asarray(tp, float)
    tok = np.asarray(tokens, float)
    h, f = m.d_model, mean_width(m)
    attn_in, attn_grads = attention_cast_widths(m, t, sp)
    inputs = tok * (attn_in + mlp_copies * h / np.where(sp, t, 1.0) + f / t)
    grads = tok * (attn_grads + (m.mlp_matrices - 1) * f / t + mlp_copies * h)
    return (per_element * inputs + WEIGHT_CAST_BYTES * np.asarray(weights, float),
            per_element * grads)


def linear_flop_share(m: ModelShape, seq: int) -> float:
    """Share of the model's training FLOPs that run in the linear layers (the rest: the
    attention core, the head, the router)."""
    f = flops_per_token(m, seq)
    router = 2.0 * m.moe_layers * m.d_model * (m.moe.experts if m.moe is not None else 0)
    return (f.forward - f.attention - f.logits - router) / f.forward


def blended_peak(bf16_peak: float, fp8_peak: float, share: float) -> float:
    """The dense peak a step reaches with ``share`` of its FLOPs at ``fp8_peak`` and the rest
    at ``bf16_peak`` (harmonic: times add): 1 / (share/fp8 + (1 - share)/bf16)."""
    return 1.0 / (share / fp8_peak + (1.0 - share) / bf16_peak)
