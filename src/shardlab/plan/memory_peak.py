"""What a framework holds at its memory peak beyond the saved state and activations.

:mod:`shardlab.plan.memory` counts the model states and the activations forward saves for
backward (:mod:`shardlab.estimate.memory`), which is what a step keeps between its
operators. A framework's measured peak (``torch.cuda.max_memory_reserved``, what
torchtitan prints; Megatron-LM's ``max allocated``) is larger by what lives only for a
moment, and by the framework's own choices of what to keep. Given a framework's
:class:`MemoryFacts` (``shardlab plan --framework``, :data:`shardlab.plan.overlap.
FRAMEWORKS`), the planner adds, on each pipeline rank it compares:

* **the loss's working set** on the head's rank: ``loss_bytes`` per logit element of the
  micro-batch (T x V/t, the vocabulary split by tp as Megatron's vocab-parallel loss and
  torchtitan's ``loss_parallel`` keep it) at the loss's peak, of which the 4 bytes of
  fp32 logits :func:`~shardlab.estimate.activations.last_stage_extra_bytes` already keeps
  are not counted twice;
* **one layer's recompute working set**: backward of a checkpointed layer runs its forward
  again and holds what it did not save, the layer's activations without recompute less
  those saved (full recompute: all of it but the input; per-operator checkpointing: the
  outputs it did not save); not at the same moment as the loss's, so the larger of the
  two is added;
* **ZeRO-3's unsharded parameters and gradients**: two layers gathered (the layer in use
  and the one prefetched; FSDP and DeepSpeed ZeRO-3 both prefetch one) at the gather's
  bytes, and one layer's unsharded gradient with its copy in the reduction's dtype.
  FSDP2 as torchtitan wraps it (``fsdp2_root``) keeps the final norm and the head
  gathered from forward to backward (torchtitan ``distributed/fsdp.py`` at b5bcd76c:
  ``reshard_after_forward`` false for ``[norm, lm_head]`` by default; the embedding is
  resharded as the blocks are), and there the moments do not add up: shardlab's dry run
  of the same program (Llama-3-8B, FSDP over 8, per-operator checkpointing,
  ``docs/guide/dryrun.md``) peaks at the start of backward holding the loss's working set
  and the gathered head, with no layer gathered. So without a pipeline the planner
  takes the largest of three moments: the loss's backward (its working set and the
  gathered head); a layer's backward (its recompute working set, two gathered layers and
  one layer's gradients, the loss's kept fp32 logits freed by then); and the head's
  backward (the logits' gradient in the compute dtype, the head gathered, its gradient
  and that gradient's copy in the reduction's dtype, the kept logits freed). With
  pipeline parallelism it reshards no unit after forward, keeps the embedding and the
  head gathered and the head's gradient until the end, and accumulates every block's
  unsharded gradient in the reduction dtype across micro-batches (FSDP2's
  ``unsharded_accumulated_grad`` in ``reduce_dtype`` while gradient sync is off for all
  but the last micro-batch), the embedding's too on rank 0, whole even under tensor
  parallelism (DTensor's embedding backward has no row-wise strategy, so the
  vocabulary-parallel embedding's gradient is the full [vocab, d_model] on every tp rank:
  :func:`shardlab.train.report_fsdp.whole_embedding_grad_bytes`); all of it is held at
  once.

``fp8_input_bytes``: with ``--dtype fp8``, the bytes each linear layer's saved input
takes (Transformer Engine keeps its fp8 copy, 1 B: Megatron; torchao keeps the bf16 input:
torchtitan; under torchao's float8 tensor-parallel styles it keeps an fp8 copy, as
shardlab's dry run shows, not priced here), :mod:`shardlab.estimate.activations`.

``held_grad_bytes``: the bytes of each gradient element the framework keeps (Megatron-LM
accumulates bf16 runs' gradients in fp32 ``main_grad`` buffers, 4), where the dtype
policy says fewer; a run's ``reduce_dtype=bf16`` makes it 2 (Megatron-Core's DDP: the
buffer is float32 only with ``grad_reduce_in_fp32``: :mod:`shardlab.plan.options`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import RECOMPUTE, Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.activations import (
    LOGIT_BYTES,
    op_checkpoint_layer_bytes,
    sp_gathered_bytes,
)
from shardlab.estimate.memory import layer_bytes
from shardlab.estimate.partition import layer_params_per_tp_rank
from shardlab.plan.space import Candidates, unique_rows


@dataclass(frozen=True)
class MemoryFacts:
    """A framework's memory facts (module docstring): bytes per logit element at the loss's
    peak, gradient bytes it holds (0: the policy's), the reduction's bytes per gradient
    element, and whether ZeRO-3 is FSDP2 as torchtitan wraps it."""

    loss_bytes: float = LOGIT_BYTES
    held_grad_bytes: int = 0
    reduce_bytes: int = 0
    fsdp2_root: bool = False
    source: str = ""
    parallel_loss_bytes: float = 0.0
    """Bytes per logit element at the loss's peak when tp > 1 splits the vocabulary and the
    framework's vocabulary-parallel loss is another implementation (0: ``loss_bytes``)."""
    combine_bytes: int | None = None
    """Bytes per element of a MoE layer's combined expert outputs kept for the gates'
    gradient (None: the policy's activation bytes; :mod:`shardlab.estimate.expert`)."""
    fp8_input_bytes: int = 0
    """Bytes of a linear layer's saved input when it multiplies in fp8 (0: the policy's
    activation bytes): 1 for Transformer Engine, which keeps the fp8 copy
    (:mod:`shardlab.estimate.activations`)."""
    sp_gathered_inputs: int = 0
    """Linear inputs per layer that sequence parallelism keeps all-gathered, the rank's
    whole T x h rather than T x h/t (:func:`gathered_input_bytes`): 0 for Megatron-LM,
    which saves the T·h/t shard and gathers it again in backward (Korthikanti et al. 2022,
    Sec. 4.2.2); 2 for DTensor's sequence parallelism (torchtitan: the attention's input,
    shared by wq, wk and wv, and the FFN's, shared by w1 and w3)."""


def rank_layout(seq: int, policy: DtypePolicy, micro_batch: int, tp: int, sp: bool,
                recompute: str, ep: int, etp: int, cp: int, capacity_factor: float = 0.0
                ) -> Layout:
    """A one-rank layout holding the fields a layer's activations read (the rest of a
    layout does not enter them)."""
    return Layout(dp=1, tp=tp, pp=1, virtual_stages=1, zero=0, sp=sp, micro_batch=micro_batch,
                  global_batch=micro_batch, seq=seq, recompute=recompute, dtype=policy,
                  schedule="1f1b", ep=ep, etp=etp, capacity_factor=capacity_factor, cp=cp)


def gathered_input_bytes(model: ModelShape, lay: Layout, inputs: int) -> float:
    """:func:`~shardlab.estimate.activations.sp_gathered_bytes` on a rank of ``lay`` (its
    T = b·s/cp tokens; under an fp8 policy gathered in fp8, as torchao's tensorwise fp8
    tensor parallelism does): what :attr:`MemoryFacts.sp_gathered_inputs` adds per layer
    and micro-batch."""
    return sp_gathered_bytes(model, lay.micro_batch * (lay.seq // lay.cp), lay.tp, lay.sp,
                             lay.dtype.activation_bytes, 1 if lay.dtype.is_fp8 else None,
                             inputs)


def saved_layer_bytes(model: ModelShape, lay: Layout, moe_layer: bool, dropout: bool,
                      flash: bool, by_op: bool, imbalance: float = 1.0,
                      modules: tuple[str, ...] = (), gathered: int = 0) -> float:
    """Bytes one layer saves per micro-batch on a rank of ``lay``: per-operator
    checkpointing's set (:func:`~shardlab.estimate.activations.op_checkpoint_layer_bytes`,
    the rank's s/cp tokens) for a dense layer under selective recompute when ``by_op``,
    else :func:`shardlab.estimate.memory.layer_bytes`; plus ``gathered`` all-gathered
    inputs (:func:`gathered_input_bytes`) where the layer keeps its linear inputs (no
    recompute, or Korthikanti's selective recompute, which a MoE layer under per-operator
    checkpointing is counted as; a dense layer under per-operator checkpointing gathers
    them again, as full recompute does)."""
    if by_op and lay.recompute == "selective" and not moe_layer:
        return op_checkpoint_layer_bytes(model, lay.micro_batch, lay.seq // lay.cp,
                                         lay.dtype.activation_bytes, tp=lay.tp, sp=lay.sp)
    # A MoE layer under per-operator checkpointing is counted as Korthikanti's selective
    # (its linear inputs kept), so it keeps the gathered ones too.
    kept = lay.recompute == "none" or (lay.recompute == "selective"
                                       and (not by_op or moe_layer))
    extra = gathered_input_bytes(model, lay, gathered) if kept else 0.0
    return layer_bytes(model, lay, moe_layer, dropout, flash, imbalance, modules) + extra


def working_tables(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                   dropout: bool, flash: bool, by_op: bool, modules: tuple[str, ...] = (),
                   gathered: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per layout: the recompute working set of one dense and one MoE layer (bytes; 0
    without recompute), per distinct (micro-batch, tp, sp, recompute, ep, etp, cp); with
    ``gathered`` all-gathered inputs (:func:`gathered_input_bytes`) in the layer's whole
    set, held while it runs again unless the layer had saved them."""
    uniq, inv = unique_rows(c.micro_batch, c.tp, c.sp, c.recompute, c.ep, c.etp, c.cp)
    rows = []
    for mb, tp, sp, rc, ep, etp, cp in uniq.tolist():
        kind = RECOMPUTE[rc]
        if kind == "none":
            rows.append((0.0, 0.0))
            continue
        whole, kept = (rank_layout(seq, policy, mb, tp, bool(sp), r, ep, etp, cp)
                       for r in ("none", kind))
        rows.append(tuple(
            max(layer_bytes(model, whole, moe, dropout, flash)
                + gathered_input_bytes(model, whole, gathered)
                - saved_layer_bytes(model, kept, moe, dropout, flash, by_op, 1.0, modules,
                                    gathered),
                0.0)
            for moe in (False, True)))
    table = np.array(rows)[inv.ravel()]
    return table[:, 0], table[:, 1]


def layer_param_tables(model: ModelShape, c: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """Per layout: parameters of one dense and one MoE layer on a tensor-parallel rank."""
    uniq, inv = unique_rows(c.tp, c.ep, c.etp)
    table = np.array([(layer_params_per_tp_rank(model, tp, False),
                       layer_params_per_tp_rank(model, tp, True, ep, etp))
                      for tp, ep, etp in uniq.tolist()], float).reshape(-1, 2)[inv.ravel()]
    return table[:, 0], table[:, 1]


def transient_bytes(model: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                    facts: MemoryFacts, *, dropout: bool, flash: bool, by_op: bool,
                    rank: np.ndarray, dense: np.ndarray, moe: np.ndarray, head: np.ndarray,
                    modules: tuple[str, ...] = ()) -> np.ndarray:
    """Bytes at the framework's peak beyond states and saved activations (module
    docstring), per layout (rows) and compared pipeline rank (columns of ``rank``,
    ``dense``/``moe``: the rank's dense and MoE layers, ``head``: whether it holds the
    head)."""
    col = lambda x: np.asarray(x, float)[:, None]  # noqa: E731 - one layout per row
    tokens = col(c.micro_batch) * seq / col(c.cp)
    logits = tokens * model.vocab / col(c.tp)
    per_logit = np.where(col(c.tp) > 1, facts.parallel_loss_bytes or facts.loss_bytes,
                         facts.loss_bytes)
    # The loss's working set beyond the kept logits, counted once: a multi-token-prediction
    # depth's own is not added (its kept logits are: activations.py).
    loss = np.where(head, np.maximum(per_logit - LOGIT_BYTES, 0.0) * logits, 0.0)
    w_dense, w_moe = working_tables(model, c, seq, policy, dropout, flash, by_op, modules,
                                    facts.sp_gathered_inputs)
    working = np.maximum(np.where(dense > 0, col(w_dense), 0.0),
                         np.where(moe > 0, col(w_moe), 0.0))
    # ZeRO-3's gathered layers and unsharded gradients (a shard group of one gathers nothing).
    p_dense, p_moe = layer_param_tables(model, c)
    layer = np.maximum(np.where(dense > 0, col(p_dense), 0.0),
                       np.where(moe > 0, col(p_moe), 0.0))
    gather = policy.gather_bytes or policy.weight_bytes
    reduce = facts.reduce_bytes or policy.grad_bytes
    sharded = col((c.zero == 3) & (c.dp_shard * c.cp > 1)) > 0
    gathered = layer * (2 * gather + policy.grad_bytes + reduce)
    if facts.fsdp2_root:
        # Every block of a pipeline rank unsharded, their gradients accumulated unsharded.
        layers = dense * col(p_dense) + moe * col(p_moe)
        gathered = np.where(col(c.pp) > 1, layers * (gather + reduce), gathered)
        # The root's embedding (rank 0) and head (the head's rank; one matrix when tied and
        # on one rank) in the weights' dtype, and the head's gradient held until the end.
        root = model.vocab * model.d_model / col(c.tp) * policy.weight_bytes
        head_matrix = head & ~((rank == 0) & model.tied)
        gathered = (gathered + np.where(rank == 0, root, 0.0)
                    + np.where(head_matrix, root, 0.0) + np.where(head, root, 0.0))
        # With a pipeline the embedding's gradient accumulates unsharded on rank 0 too, and
        # whole: DTensor's embedding backward has no row-wise strategy, so under tp the
        # vocabulary-parallel embedding's gradient is the full [vocab, d_model] on every tp
        # rank (train/report_fsdp.whole_embedding_grad_bytes, measured by the dry run).
        embedding_grad = model.vocab * model.d_model * reduce
        gathered = gathered + np.where((col(c.pp) > 1) & (rank == 0), embedding_grad, 0.0)
    fsdp = np.where(sharded, gathered, 0.0)
    if not facts.fsdp2_root:
        return np.maximum(loss, working) + fsdp
    # FSDP2 as torchtitan wraps it, without a pipeline: the moments do not coincide
    # (module docstring), so the largest of three counts.
    kept_logits = np.where(head, LOGIT_BYTES * logits, 0.0)
    grad_out = np.where(head, policy.activation_bytes * logits, 0.0)
    phases = np.maximum.reduce([
        loss + np.where(head_matrix, root, 0.0),
        working + layer * (2 * gather + policy.grad_bytes + reduce) - kept_logits,
        grad_out + np.where(head, 2 * root + root / policy.weight_bytes * reduce, 0.0)
        - kept_logits])
    return np.where((col(c.pp) == 1) & sharded, phases, np.maximum(loss, working) + fsdp)
