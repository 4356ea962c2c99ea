"""The data-parallel groups of a run's document: what FSDP, DDP and HSDP send, over dp x cp.

The groups (:mod:`shardlab.distributed.mesh`): FSDP shards every parameter over the
``dp_shard_cp`` group of dp/R x cp ranks (context parallelism folded in, as torchtitan
does; R = ``dp_replicate``, 1 without HSDP), and under HSDP each rank then all-reduces its
gradient shard with the same shard of the other R - 1 replicas. The K/V gathers of
context parallelism are :mod:`shardlab.estimate.context`'s.
"""

from __future__ import annotations

from typing import Any

from shardlab.estimate.comm import fsdp2_padded, ring_allreduce_bytes, tensor_rows
from shardlab.estimate.fp8 import tp_fp8_weights
from shardlab.train.config import bf16_compute
from shardlab.train.report_moe import stage_layer_ids

FP8_GATHER_BYTES = 1
"""Bytes per element of a weight FSDP2 gathers in fp8 (E4M3)."""


def shard_ranks(cfg: Any) -> int:
    """Ranks FSDP shards a parameter over: dp/R x cp (every dp x cp rank without HSDP)."""
    return cfg.dp // cfg.dp_replicate * cfg.cp


def shard_position(cfg: Any, rank: dict[str, Any]) -> int:
    """``rank``'s place in its FSDP shard group (the dp_shard_cp dim: shard-major, cp
    inside), from its data-parallel index (replica-major) and cp index."""
    return rank["dp_rank"] % (cfg.dp // cfg.dp_replicate) * cfg.cp + rank.get("cp_rank", 0)


def replica_bytes(cfg: Any, padded: int, n: int, grad_bytes: int) -> float:
    """Bytes one rank sends per step across HSDP's replicas: FSDP2 all-reduces the rank's
    reduce-scattered gradient shard (``padded // n`` elements: every parameter's dim 0
    padded to a multiple of the shard group's ``n`` ranks, as FSDP2 shards it) over the R
    replicas at each gradient sync (:func:`syncs`), ring 2(R-1)/R of it (Patarasuk & Yuan
    2009). Computed here from the ring formula: the cost model's
    :func:`shardlab.estimate.comm.layout_dp_bytes` counts the unpadded shard."""
    return syncs(cfg) * ring_allreduce_bytes(padded // n * grad_bytes, cfg.dp_replicate)


def fp8_gathered(cfg: Any, n: int) -> list[tuple[int, int]]:
    """Per pipeline rank, with ``--fp8-all-gather``: (padded elements FSDP2 gathers in fp8,
    fp8 weight tensors): each of the rank's blocks' fp8 linear weights on its tp rank
    (:func:`shardlab.estimate.fp8.tp_fp8_weights`: a MoE block's are its attention's and
    shared experts', its router and routed experts being bf16), dim 0 padded to a multiple
    of the ``n``-rank shard group; (0, 0) without it."""
    if not cfg.fp8_all_gather:
        return [(0, 0)] * cfg.pp
    m = cfg.shape
    kinds = {moe: list(tp_fp8_weights(m, cfg.tp, moe).values())
             for moe in ((False, True) if m.moe is not None else (False,))}
    out = []
    for r in range(cfg.pp):
        blocks = [kinds[m.moe is not None and i >= m.dense_layers]
                  for i in stage_layer_ids(cfg, r)]
        out.append((sum(fsdp2_padded(b, n) for b in blocks), sum(len(b) for b in blocks)))
    return out


def kept_padded(cfg: Any, n: int, vocab_parallel: bool) -> int:
    """Padded elements of the unit FSDP2 keeps gathered from forward to backward under
    ZeRO-3 without a pipeline (:func:`shardlab.distributed.data_parallel.apply_fsdp`): the
    final norm and the head, or with a tied head the embedding, learned positions and
    final norm; 0 otherwise (``fsdp-zero2`` and pipelines keep every unit)."""
    if cfg.pp > 1 or cfg.dp_mode != "fsdp":
        return 0
    _, first, last = tensor_rows(cfg.shape, cfg.tp, vocab_parallel)
    return fsdp2_padded(first + last[:-1] if cfg.shape.tied else last, n)


def dp_bytes(params: float, padded: int, policy: Any, zero: int, cfg: Any,
              n: int | None = None, fp8: tuple[int, int] = (0, 0), kept: int = 0) -> float:
    """Bytes one rank sends per step for data parallelism, as torch runs it.

    DDP all-reduces the gradients once, after the last micro-batch (ZeRO paper's 2Ψ):
    the ring's mean 2(p-1)/p·Ψ, which is what the meter reports for an all-reduce (it
    reads payloads; gloo and NCCL cut the buffer by their own rules).
    FSDP2 reduce-scatters them after every micro-batch without a pipeline, once in one
    (:func:`syncs`), and all-gathers the weights k times: ``fsdp``
    (ZeRO-3) before every micro-batch's forward and backward (k = 2m), but for the
    ``kept`` padded elements (:func:`kept_padded`: the final norm and head, gathered once
    per micro-batch, k = m); ``fsdp-zero2``
    keeps them from forward to backward but reshards after each backward (k = m); in a
    pipeline both keep them from the first forward to the last backward (k = 1:
    train.py's reshard policy, and torch.distributed.pipelining defers the reshard
    after backward to the last micro-batch). FSDP2 pads every parameter's dim 0 to a
    multiple of dp (``padded`` elements: :func:`~shardlab.estimate.comm.fsdp2_padded_params`),
    so every rank sends exactly (dp-1) padded shards per collective, whether or not dp
    divides the model. ``n``: the group's ranks (dp; FSDP's dp x cp shard group with
    context parallelism or HSDP; expert_dp for a MoE's experts). ``fp8``: (padded
    elements gathered in fp8, their tensors) of :func:`fp8_gathered`: those elements go
    at 1 B, and after each step one all-reduce of the tensors' fp32 amaxes (torchao's
    scale precompute) adds its ring share.
    """
    n = cfg.dp if n is None else n
    # Under bf16 FSDP2's MixedPrecisionPolicy casts the shards before gathering them (2 bytes)
    # and reduces gradients in fp32.
    gathered = 2 if bf16_compute(cfg) else policy.weight_bytes
    if zero == 0:
        return ring_allreduce_bytes(params * policy.grad_bytes, n)
    m = cfg.microbatches
    k = 1 if cfg.pp > 1 else (2 * m if zero == 3 else m)
    fp8_padded, fp8_tensors = fp8
    gathers = (padded - fp8_padded) // n * gathered + fp8_padded // n * FP8_GATHER_BYTES
    gathers_all = k * gathers - (k - m) * (kept // n * gathered)
    amax = ring_allreduce_bytes(fp8_tensors * 4, n) if fp8_tensors else 0.0
    reduces = syncs(cfg)
    return float((n - 1) * (gathers_all + reduces * padded // n * policy.grad_bytes) + amax)


def syncs(cfg: Any) -> int:
    """Gradient reductions per step under FSDP2: one per micro-batch without a pipeline
    (train_step syncs every micro-batch, as torchtitan's accumulation loop does), one in a
    pipeline (torch's pipelining stage syncs only the last micro-batch)."""
    return cfg.microbatches if cfg.pp == 1 else 1


def layout_keys(cfg: Any) -> str:
    """The layout line's loss-parallel, context-parallel, uneven-stage, HSDP, MoE routing
    and fp8-gather keys, only where set."""
    out = " loss_parallel=1" if cfg.loss_parallel else ""
    out += f" cp={cfg.cp}" if cfg.cp > 1 else ""
    if cfg.stage_layers:
        out += " stage_layers=" + "+".join(map(str, cfg.stage_layers))
    out += f" dp_replicate={cfg.dp_replicate}" if cfg.dp_replicate > 1 else ""
    out += f" routing={cfg.routing}" if cfg.routing != "learned" else ""
    return out + (" fp8_all_gather=1" if cfg.fp8_all_gather else "")
