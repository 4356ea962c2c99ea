"""Tensor-parallel bytes of torch's DTensor plan, as ``shardlab train`` runs it.

:func:`shardlab.estimate.comm.tp_bytes_per_stage` counts Megatron-LM's collectives:
q, k and v fused into one column-parallel linear, so backward all-reduces the input
gradient once per block half. torch's plan (``shardlab.distributed.parallelize.tp_plan``, the
same as torchtitan's) keeps q, k, v (and llama's gate and up) as separate
``ColwiseParallel`` linears. Each block half's input enters once through
``PrepareModuleInput`` (Replicate without sequence parallelism, since 2026-12-07; until
then each linear converted its replicated input with its own ``DTensor.from_local``, and
backward all-reduced the input gradient once per column-parallel linear: 4 in a GPT
block, 5 in a llama block), so the linears' partial input gradients meet first and
backward all-reduces once per block half (:data:`MODULE_INPUTS`), while forward
all-reduces the two row-parallel outputs: Megatron's count. With sequence parallelism
``PrepareModuleInput`` gathers the sequence once per block half and the partial
gradients meet in one reduce-scatter (Korthikanti et al. 2022).

Full recompute (``checkpoint``, non-reentrant) stops recomputing a block once the last
tensor backward needs is back: the MLP's output collective is not re-run, so a block's
recompute adds one all-reduce (without SP) or two all-gathers and one reduce-scatter
(with SP), not Megatron's two all-reduces. Per-operator checkpointing (torchtitan's
policy, ``op_recompute``) saves the reduce-scatters' outputs, so it adds the same
all-reduce without SP and the two all-gathers with it.

Around the blocks (per micro-batch; A = b·s·d activation bytes, V the vocabulary):

* untied llama (vocabulary-parallel embedding and head): the embedding all-reduces its
  output (SP: reduce-scatters it, and all-gathers its gradient), the head all-reduces
  its input gradient (SP: all-gathers its input, reduce-scatters the gradient); the
  logits are all-gathered (b·s·V) unless ``loss_parallel``, whose cross-entropy
  all-reduces three b·s float32 vectors (max, sum of exponentials, target logit:
  ``torch.distributed.tensor.parallel.loss``);
* tied GPT (embedding and head replicated): nothing without SP; with it, the sequence
  scattered at the first block gathers its gradient, and the last block's output is
  gathered for the head.

With SP, the norm weights' partial gradients are all-reduced (the row-parallel biases
are added before the reduce-scatter, so theirs are whole; Megatron adds them after and
all-reduces them too): by DTensor in every micro-batch's backward, or, under FSDP, once
per step when FSDP reduces the accumulated gradients. Qwen3's query/key norms
(``qk_norm``) see only the rank's heads, so theirs are all-reduced so with or without SP.

**fp8** (``train --dtype fp8``: torchao's float8 linears, each with torchao's float8 style,
``shardlab.distributed.tensor_parallel.block_plan``): a float8 linear casts its input to
E4M3 before the input is redistributed and its output gradient to E5M2 before the
backward's redistribution, so under sequence parallelism the attention's and the MLP's
input all-gathers (when every linear reading that input is fp8: it is cast once, before
the gather) and the backward's all-gathers at the row-parallel outputs move 1-byte
elements; the reduce-scatters and the all-reduces without sequence parallelism stay
bf16. Each cast of a tensor split over tp scales it by the amax of the whole tensor: one
all-reduce of a float64 scalar (torchao ``amax_to_scale`` upcasts the DTensor's partial
max before the division forces its reduction; :data:`FP8_SCALE_BYTES`). Per fp8 linear
and micro-batch: its weight twice (forward, and again for the input gradient), its
output gradient (a column-parallel one's only without sequence parallelism: a
row-parallel output is whole there), the input of a row-parallel one, and under sequence
parallelism the attention's and MLP's prepared inputs; a recomputed forward (full or
per-operator) casts its weights and inputs again.

Every byte here is what one rank sends with ring collectives (module
:mod:`shardlab.estimate.comm`); ``shardlab train`` measures the same per rank.
"""

from __future__ import annotations

from shardlab.config.layout import V_SCHEDULES, Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.comm import ring_allreduce_bytes, ring_gather_bytes
from shardlab.estimate.fp8 import prepared_inputs, row_parallel
from shardlab.estimate.params import norm_params, qk_norm_params
from shardlab.estimate.partition import chunk_rank, layout_rank_layers


def column_linears(m: ModelShape) -> int:
    """Column-parallel linears of one block in torch's plan: q, k, v and the MLP input
    (two for a gated llama MLP)."""
    return 3 + (2 if m.style == "llama" else 1)


def scatters_at_blocks(m: ModelShape) -> bool:
    """Whether, under sequence parallelism, torch's plan scatters the sequence at the first
    block's input (the embedding's output is replicated: a tied embedding is not split, and
    learned positions are added after it) rather than by the embedding's reduce-scatter
    (:func:`shardlab.distributed.tensor_parallel.root_plan`)."""
    return m.tied or m.style == "gpt"


MODULE_INPUTS = 2
"""Module inputs of one block that its column-parallel linears read: the attention's (q, k,
v) and the MLP's. Without sequence parallelism each enters replicated once
(:func:`shardlab.distributed.tensor_parallel.block_plan`), so backward all-reduces one
gradient per input, Megatron-LM's f operator (Shoeybi et al. 2019, Fig. 3), not one per
linear (:func:`column_linears`: 5 in a llama block)."""


FP8_SCALE_BYTES = 8
"""Bytes of one fp8 scale's all-reduce payload: a float64 amax (module docstring)."""


def fp8_block_bytes(m: ModelShape, layout: Layout, fp8: frozenset[str], elements: float,
                    again: bool, norm_bytes: float, prescaled: bool = False) -> float:
    """Bytes one tensor-parallel rank sends per block and micro-batch for the fp8 linears
    ``fp8`` (:func:`shardlab.estimate.fp8.tp_fp8_linears`) beyond the bf16 count of
    :func:`tp_bytes_dtensor` (module docstring; negative: 1-byte gathers save more than the
    scales cost). ``elements``: one activation's elements (b·s·d); ``again``: the forward
    runs twice; ``norm_bytes``: bytes per element of a norm's output, which the prepared
    inputs' bf16 gathers moved (4 under autocast), the row outputs' gradients moving the
    activation's; ``prescaled``: FSDP gathers the weights in fp8 with scales computed
    after the optimizer step (``--fp8-all-gather``), so casting a weight reduces no
    amax."""
    t, sp = layout.tp, layout.sp
    if not fp8 or t == 1:
        return 0.0
    # The prepared inputs' casts split the tensor over tp (reduce their amax) under SP only.
    prepared = sp * sum(prepared_inputs(m, fp8))
    rows = sum(1 for name in fp8 if row_parallel(name))
    column = len(fp8) - rows
    weights = 0 if prescaled else len(fp8)
    scales = (2 * weights + (len(fp8) if sp else column) + rows + prepared
              + again * (weights + rows + prepared))
    out = scales * ring_allreduce_bytes(FP8_SCALE_BYTES, t)
    if sp:  # each fp8 gather moves 1 byte an element
        act = layout.dtype.activation_bytes
        out -= ring_gather_bytes(elements, t) * ((1 + again) * prepared * (norm_bytes - 1)
                                                 + rows * (act - 1))
    return out


def tp_bytes_dtensor(m: ModelShape, layout: Layout, loss_parallel: bool = False,
                     fsdp: bool = False, op_recompute: bool = False,
                     fp8: frozenset[str] = frozenset(), fp8_gather: bool = False,
                     autocast: bool = False) -> list[float]:
    """Bytes one tensor-parallel rank of each pipeline stage sends per step under torch's
    DTensor plan (module docstring); the tied GPT head stays replicated, the untied
    llama head and embedding are split over the vocabulary. ``fsdp``: the data-parallel
    wrapper is FSDP (it reduces the norms' gradients once per step); ``op_recompute``:
    the blocks run under per-operator checkpointing (the layout then says
    ``selective``); ``fp8``: a dense block's fp8 linears (:func:`fp8_block_bytes`);
    ``fp8_gather``: FSDP gathers them in fp8 (``--fp8-all-gather``): their scales come
    from one all-reduce of their fp32 amaxes after each step, over tp too, the weights'
    DTensors spanning both dims (torchao ``precompute_float8_dynamic_scale_for_fsdp``);
    ``autocast``: bf16 under autocast (``train`` without FSDP's mixed precision), whose
    fp32 parameters make the norms' and the embedding's outputs fp32: their collectives,
    and those of their gradients, move 4-byte elements, the matmuls' outputs and theirs
    bf16."""
    lay, t = layout, layout.tp
    if t == 1:
        return [0.0] * lay.pp
    elements = lay.micro_batch * lay.seq * m.d_model
    act = elements * lay.dtype.activation_bytes  # a matmul's output
    norm_bytes = 4 if autocast else lay.dtype.activation_bytes
    wide = elements * norm_bytes  # a norm's output, the embedding's, the residual stream
    ar, g = ring_allreduce_bytes(act, t), ring_gather_bytes(act, t)
    ar_wide, g_wide = ring_allreduce_bytes(wide, t), ring_gather_bytes(wide, t)
    full = lay.recompute == "full"
    again = full or op_recompute  # the forward's collectives that run again
    if lay.sp:
        # All-gathers: the norms' outputs (2 a block, again when recomputed) and, backward,
        # the row-parallel outputs' gradients (2); reduce-scatters: the row-parallel
        # outputs (2, the attention's again under full recompute) and, backward, the
        # gathered inputs' gradients (2).
        per_layer = (4 + 2 * again) * g_wide + (4 + full) * g
    else:  # the row outputs all-reduced forward; the module inputs' gradients backward
        per_layer = (2 + again) * ar + MODULE_INPUTS * ar_wide
    per_layer += fp8_block_bytes(m, lay, fp8, elements, again, norm_bytes, fp8_gather)
    vocab_parallel = not m.tied
    logits = lay.micro_batch * lay.seq * m.vocab * lay.dtype.activation_bytes
    # Uneven stages and the V schedules place layers and the head as the schedule does
    # (the head's chunk is the last one: rank 0 in a V).
    head = chunk_rank(lay.pp * lay.virtual_stages - 1, lay.pp, lay.schedule in V_SCHEDULES)
    out = []
    for r, layers in enumerate(layout_rank_layers(m, lay)):
        first, last = r == 0, r == head
        per_mb = layers * per_layer
        if vocab_parallel:
            ends = first + last
            per_mb += ends * (2 * g_wide if lay.sp else ar_wide)
            if last:
                per_mb += (3 * ring_allreduce_bytes(lay.micro_batch * lay.seq * 4, t)
                           if loss_parallel else ring_gather_bytes(logits, t))
        elif lay.sp:
            per_mb += (first + last) * g_wide
        nbytes = lay.microbatches * per_mb
        if fp8 and fp8_gather:  # the step's amaxes of the rank's fp8 weights, fp32 each
            nbytes += ring_allreduce_bytes(4 * layers * len(fp8), t)
        if lay.sp or m.qk_norm:
            norms = (layers * 2 + (1 if last and vocab_parallel else 0)) if lay.sp else 0
            times = 1 if fsdp else lay.microbatches
            # Under FSDP the reduced gradients are the gathered (unsharded) parameters',
            # in the compute dtype (bf16 under mixed precision: FSDP casts to its fp32
            # reduce dtype only for its own reduce-scatter); the dry run of Llama-3-8B
            # at dp=8 x tp=8 measured them so. In a pipeline FSDP accumulates the
            # unsharded gradients over the micro-batches in its reduce dtype, so they are
            # reduced in fp32 (the dry run of dp=2 tp=2 pp=2 sp: 512 B per 128-wide norm).
            elem = (lay.dtype.activation_bytes if fsdp and lay.pp == 1
                    else lay.dtype.grad_bytes)
            # Qwen3's query/key norms see the rank's own heads: partial with or without sp.
            elements = norms * norm_params(m) + layers * qk_norm_params(m)
            nbytes += times * ring_allreduce_bytes(elements * elem, t)
        out.append(nbytes)
    return out
