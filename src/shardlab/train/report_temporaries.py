"""What a rank of shardlab's program holds at its memory peak beyond its states and the
activations it saves for backward: the cost model's ``temporaries``.

Four terms, each on the ranks that hold it; the first three at the start of backward (the
loss's backward), where the dry run of the same program puts the peak of the runs below:

* **the loss** (the rank holding the head): without loss parallelism the fp32 gradient of
  the log-softmax output and ``log_softmax_backward``'s fp32 result,
  :data:`LOSS_BACKWARD_BYTES` per logit (the saved fp32 log-probabilities are among the
  activations: :mod:`shardlab.train.report_activations`); each tensor-parallel rank holds
  the whole vocabulary, since the head's output is gathered. With loss parallelism the
  logits stay split over tp, at :data:`LOSS_PARALLEL_BYTES` per local logit;
* **FSDP2's units kept gathered** without a pipeline: under ZeRO-3 the final norm and the
  head (one unit with the embedding when tied; ``data_parallel.apply_fsdp``), under
  ``fsdp-zero2`` every unit (none is resharded after forward), at the compute dtype;
* **inside a pipeline**, what FSDP keeps gathered for the whole step
  (:func:`~shardlab.train.report_fsdp.pipeline_fsdp_bytes`);
* **under full recompute, a block's backward**: the block's forward run again keeps all
  a block without recompute keeps
  (:func:`~shardlab.train.report_activations.recomputed_block_bytes`), at a moment of its
  own: the larger of it and the loss's is counted. A pipeline's first stages peak there:
  Llama-3.1-405B at ``dp=8 tp=8 pp=8 micro_batch=4 recompute=full`` (TT-9's layout in
  bf16), rank 0: the dry run holds 82.88 GB against 85.33 counted (79.27 without the
  term); a 4-layer llama at d = 256 and 512 over ``dp=2 pp=2``: 0.95 and 0.93 of the count
  on the two stages (1.12 and 1.03, 1.10 and 1.03 without it; 2026-12-07).

Measured with ``shardlab dryrun`` (Llama-3-8B, seq 4096-8192; 2026-12-07):

* ``dp=8 recompute=op micro_batch=2``, seq 8192: 16.81 GB of temporaries = 8 B x 2 x 8192
  x 128,256 logits, and the 1.05 GB gathered head beside them;
* ``dp=8 tp=8 sp=1 recompute=selective``: 8.54 GB = 8 B x 8192 x 128,256 (the whole
  vocabulary on every tp rank) + the head's 1/8, 131 MB;
* ``tp=2 loss_parallel=1`` on a 2-layer model with a 65,536-token vocabulary, 1,024
  tokens: 402.7 MB of temporaries in the loss's backward, 12.0 B per local logit (18 B in
  its forward until the dry run stopped counting DTensor's sharding propagation:
  :mod:`shardlab.dryrun.fake`);
* ``dp=8 zero=2``, seq 4096: 16.06 GB of unsharded parameters (8.03 B x 2 B) and the
  loss's 4.20 GB.

Not counted: the activation gradients of a layer's backward, and without recompute its
working set beyond what the layer saved, which the dry run shows below the loss's moment
for these models. A mixture of experts' is larger, and can be the peak: with one rank of
expert data parallel (dp = ep) the expert unit's backward holds about 12 B per local
expert parameter in bf16 (its gathered weights 2, their gradients 2, FSDP2's reduce-scatter
input and output 4 + 4 in fp32: ``foreach_reduce`` at torch 2.13; 12.1-12.5 B measured by
``shardlab dryrun`` at d = 512, f = 2048-4096, dp = ep = 2); at longer sequences the
expert rows' activation gradients (two [R, f] products and a matmul's output at d = 1024,
f = 4096, seq 2048). Inside a pipeline FSDP's term covers it: Mixtral 8x7B over ``dp=8
pp=8 ep=8 recompute=full`` holds 7.37 GB of temporaries against 7.29 GB counted
(docs/guide/dryrun.md; 1.53 GB before :func:`pipeline_fsdp_bytes` counted a MoE stage).
"""

from __future__ import annotations

from typing import Any

from shardlab.estimate.comm import fsdp2_padded_params
from shardlab.train.config import bf16_compute, loss_split
from shardlab.train.report_activations import recomputed_block_bytes
from shardlab.train.report_cp import kept_padded, shard_ranks
from shardlab.train.report_fsdp import pipeline_fsdp_bytes, vocab_parallel
from shardlab.train.report_moe import moe_padded_params

LOSS_BACKWARD_BYTES = 8
"""Bytes per logit the loss's backward holds beyond its saved fp32 log-probabilities: the
nll gradient and ``log_softmax_backward``'s result, both fp32 (module docstring)."""

LOSS_PARALLEL_BYTES = 12
"""Bytes per local logit the loss's backward holds under ``loss_parallel`` beyond its saved
fp32 log-probabilities: torch's ``_nll_loss_and_log_softmax_backward`` (distributed/
tensor/parallel/loss.py, 2.13) builds ``zeros_like(x)``, ``exp(x)`` and their sum, fp32
each. Its forward holds less: the bf16 logits, their fp32 copy, ``shifted`` and
``exp(shifted)``, 14 B with the 4 saved."""


def local_logits(cfg: Any) -> float:
    """Logit elements of one micro-batch on the head's rank: its tokens (s/cp of each
    sequence) times the vocabulary, split over tp only under loss parallelism (as
    ``train`` runs it: without a pipeline)."""
    mb = cfg.micro_batch or cfg.global_batch // cfg.dp
    split = cfg.tp if loss_split(cfg) else 1
    return mb * (cfg.seq // cfg.cp) * cfg.shape.vocab / split


def loss_temporary_bytes(cfg: Any) -> float:
    """The loss's bytes at its peak beyond the saved activations (module docstring)."""
    return (LOSS_PARALLEL_BYTES if loss_split(cfg) else LOSS_BACKWARD_BYTES) * local_logits(cfg)


def kept_unit_bytes(cfg: Any) -> float:
    """Bytes of FSDP2's units kept gathered from forward to backward without a pipeline, at
    the compute dtype: under ZeRO-3 the final norm and head (with a tied head, the unit it
    shares with the embedding: :func:`~shardlab.train.report_cp.kept_padded`), under
    ``fsdp-zero2`` the rank's every parameter; each padded as FSDP2 gathers it. 0 for DDP,
    a shard group of one, or a pipeline (:func:`pipeline_fsdp_bytes` counts that)."""
    n = shard_ranks(cfg)
    if cfg.pp > 1 or cfg.dp_mode == "ddp" or n == 1:
        return 0.0
    compute = 2 if bf16_compute(cfg) else 4
    if cfg.dp_mode == "fsdp":
        return float(kept_padded(cfg, n, vocab_parallel(cfg)) * compute)
    if cfg.shape.moe is not None:
        return float(sum(moe_padded_params(cfg)[0]) * compute)
    return float(fsdp2_padded_params(cfg.shape, cfg.tp, 1, n, vocab_parallel=vocab_parallel(cfg))[0]
                 * compute)


def predicted_temporary_bytes(cfg: Any, pp_rank: int) -> float:
    """The cost model's temporaries on a rank of pipeline stage ``pp_rank`` (module
    docstring): FSDP's pipeline term everywhere, the kept units on the rank that holds
    the head, and the larger of two moments: the loss's backward (that rank) and, under
    full recompute, a block's backward with its forward run again
    (:func:`~shardlab.train.report_activations.recomputed_block_bytes`)."""
    held = pipeline_fsdp_bytes(cfg, pp_rank)
    last = pp_rank == cfg.pp - 1
    if last:
        held += kept_unit_bytes(cfg)
    return held + max(loss_temporary_bytes(cfg) if last else 0.0,
                      recomputed_block_bytes(cfg))
