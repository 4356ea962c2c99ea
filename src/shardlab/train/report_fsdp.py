"""What FSDP holds for a whole step when it runs inside shardlab's pipeline, beyond the
model states and the saved activations the cost model counts.

torch's pipelining stage, given an FSDP2 module, calls ``set_reshard_after_backward(False)``
and turns gradient sync off for every micro-batch but the last
(``_PipelineStageBase.backward_maybe_with_nosync``, torch/distributed/pipelining/stage.py):
once a micro-batch has run backward the stage stays gathered, and each later micro-batch
adds its gradients into unsharded buffers in the reduction dtype (fp32) until the last one
reduce-scatters them. A rank of pipeline stage p then holds, besides its shards, its
blocks' parameters gathered at the compute dtype and every parameter's unsharded gradient
in fp32. ``shardlab dryrun llama-3-8b --gpus 8 --layout "dp=4 pp=2 zero=3 micro_batch=1
recompute=full" --seq 2048`` measures both on rank 0 at its forward peak: "Unsharded
Param" 6.98 GB (16 blocks x 218 M parameters x 2 B) and 16.09 GB of fp32 gradients (its
4.02 B parameters x 4 B), 2.3x the states and activations the cost model had counted.
Under tensor parallelism the first stage's embedding gradient is accumulated whole, not
at its vocabulary shard (:func:`whole_embedding_grad_bytes`).
"""

from __future__ import annotations

from typing import Any

from shardlab.estimate.expert import rank_params_split
from shardlab.estimate.partition import (
    layer_params_per_tp_rank,
    rank_layers,
    stage_params,
    vocab_rows,
)
from shardlab.train.config import bf16_compute
from shardlab.train.report_cp import shard_ranks
from shardlab.train.report_moe import run_layout, stage_layer_ids

GRAD_ACCUMULATE_BYTES = 4
"""FSDP2's unsharded gradient accumulation dtype in shardlab: fp32 (``reduce_dtype``)."""


def vocab_parallel(cfg: Any) -> bool:
    """Whether the embedding and head split over tp: not when tied, which stay whole on
    every tensor-parallel rank (tensor_parallel.py)."""
    return cfg.tp > 1 and not cfg.shape.tied


def rank_params(cfg: Any, pp_rank: int) -> int:
    """Parameters of a dense model on one rank of pipeline stage ``pp_rank``."""
    return stage_params(cfg.shape, cfg.tp, cfg.pp, cfg.virtual_stages,
                        vocab_parallel=vocab_parallel(cfg),
                        stage_layers=cfg.stage_layers)[pp_rank]


def pipeline_fsdp_bytes(cfg: Any, pp_rank: int) -> float:
    """Bytes a rank of pipeline stage ``pp_rank`` holds gathered for the step (module
    docstring): its blocks' parameters at the compute dtype (2 B under bf16, else 4) plus
    all its parameters' unsharded fp32 gradients. A mixture of experts' blocks hold the
    rank's own experts (E/ep, as the rank keeps them: its experts' FSDP units behave as the
    blocks' under the stage). 0 without a pipeline, without FSDP (DDP, or a shard group of
    one) or with a single micro-batch (no accumulation). Measured for a MoE (2026-12-07):
    Mixtral 8x7B over ``dp=8 pp=8 ep=8 recompute=full``, seq 4096, rank 0: 4.22 GB of fp32
    gradient copies at its peak (45 ``_to_copy`` storages: its 1.05 G parameters x 4 B)."""
    if (cfg.pp == 1 or cfg.dp_mode == "ddp" or shard_ranks(cfg) == 1
            or cfg.microbatches == 1):
        return 0.0
    if cfg.shape.moe is not None:
        first_moe = cfg.shape.dense_layers
        blocks = sum(layer_params_per_tp_rank(cfg.shape, cfg.tp, i >= first_moe, cfg.ep,
                                              cfg.etp)
                     for i in stage_layer_ids(cfg, pp_rank))
        params = sum(rank_params_split(cfg.shape, run_layout(cfg),
                                       vocab_parallel(cfg))[pp_rank])
    else:
        blocks = (rank_layers(cfg.shape.layers, cfg.pp, cfg.virtual_stages,
                              cfg.stage_layers)[pp_rank]
                  * layer_params_per_tp_rank(cfg.shape, cfg.tp, moe_layer=False))
        params = rank_params(cfg, pp_rank)
    compute = 2 if bf16_compute(cfg) else 4
    return float(blocks * compute + params * GRAD_ACCUMULATE_BYTES
                 + whole_embedding_grad_bytes(cfg, pp_rank))


def whole_embedding_grad_bytes(cfg: Any, pp_rank: int) -> float:
    """What the vocabulary-parallel embedding's accumulated gradient holds on the first
    stage beyond its vocabulary shard: its other tp ranks' rows, in fp32. DTensor's
    ``embedding_dense_backward`` has no row-wise strategy (torch/distributed/tensor/_ops/
    _embedding_ops.py: column-wise, batch-sharded and partial ones only), so the gradient
    of a weight sharded on the vocabulary comes out whole (placement Replicate, the full
    [vocab, d_model]) on every tensor-parallel rank, and FSDP2 accumulates it whole in
    fp32 until the reduce-scatter redistributes it to the parameter's shard. Measured
    (2026-12-07, reading FSDP2's state after each backward of the dry run of a 4-layer
    llama, d 512, vocabulary 65,536, seq 128, at ``dp=2 tp=2 pp=2 zero=3 micro_batch=1``):
    stage 0's ``unsharded_accumulated_grad`` summed 151.0 MB, 134.2 MB of it the
    embedding's [65,536, 512] in fp32 with placement Replicate, where its vocabulary shard
    is half that. 0 without tensor
    parallelism over the vocabulary, off the first stage, or where
    :func:`pipeline_fsdp_bytes` holds nothing."""
    if pp_rank != 0 or not vocab_parallel(cfg):
        return 0.0
    m = cfg.shape
    return float((m.vocab - vocab_rows(m, cfg.tp)) * m.d_model * GRAD_ACCUMULATE_BYTES)
