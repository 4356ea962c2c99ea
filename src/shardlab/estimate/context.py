"""Context parallelism: what splitting every sequence over cp ranks costs one rank (torch-free).

Placement (Llama 3, Dubey et al. 2024, arXiv 2407.21783, Sec. 3.3.2; torchtitan's
``context_parallel`` with its load-balanced sharding): the s tokens of a sequence are cut
into 2·cp chunks of c = s/(2·cp) tokens, and cp rank i holds chunks i and 2cp-1-i, so
every rank holds s/cp tokens (:func:`rank_positions`). Everything outside attention is
per token: a cp rank runs it on its s/cp tokens exactly as a rank of the same layout
with sequence s/cp would (:func:`local_layout`).

Attention, all-gather form (Llama 3 Sec. 3.3.2): each rank computes Q, K and V of its
own tokens, rotates Q and K by its own positions, all-gathers K and V over the cp group
and attends with its local queries to all s keys under the causal mask. With
grouped-query attention K and V are 2·kv_heads·head_dim wide per token (``kv_dim``), not
the query width, which is what makes the gather cheap ("K and V tensors are much smaller
than Q" with GQA, ibid.). Per layer and micro-batch b, on a tensor-parallel rank (kv
heads split over tp), a ring all-gather of equal chunks sends, from every rank:

    forward   (cp-1) · b · (s/cp) · 2 · (kv_dim/tp) · e bytes      (all-gather of K, V)
    backward  the same bytes: the reduce-scatter of dK, dV, the gather's autograd
              reverse (each rank gets the gradient of its own K, V summed over the
              ranks whose queries used them)

e the bytes of an activation element. Full recompute runs the forward's gather again
before backward (:func:`cp_passes`). These are exact integers: make_layout requires
2·cp | s and tp | kv_heads. Ring attention (Liu et al. 2023) sends the same K/V blocks
around the ring, (cp-1) blocks per rank per direction, so the same bytes.

Activations (:func:`cp_layer_activation_bytes`): every per-token term divides by cp; the
attention scores of a rank's s/cp queries against all s keys divide by cp too (not cp²);
what stays whole is K and V: the kernel keeps the gathered s-token K and V for backward,
(cp-1)/cp of them beyond the rank's own (:func:`gathered_kv_bytes`).

FLOPs: the model's FLOPs per token do not change (every matmul runs once per token on
one rank, attention over the same query-key pairs), so MFU's numerator is the
one-device one. Under a causal mask, query p meets p+1 keys: the zigzag gives every rank
exactly 1/cp of the (s² + s)/2 pairs (:func:`rank_causal_pairs`), while the naive
contiguous split gives the last rank (2cp-1)/cp times the mean (1.5 at cp=2, 1.75 at
cp=4, towards 2: :func:`causal_imbalance`).

Gradients: the cp ranks of a replica hold the same parameters and see different tokens,
so their gradients are summed over dp x cp; FSDP/ZeRO folds cp into its shard group
(torchtitan's ``dp_shard_cp`` mesh), and with HSDP the shard group is dp_shard x cp
inside each of dp_replicate replicas (:func:`grad_sync_bytes`).
"""

from __future__ import annotations

import dataclasses

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.activations import activation_terms, layer_activation_bytes
from shardlab.estimate.comm import (
    ring_all_gather_sent,
    ring_allreduce_sent,
    ring_chunks,
    ring_reduce_scatter_sent,
)
from shardlab.estimate.partition import layout_rank_layers
from shardlab.estimate.states import zero_groups

# -- placement -----------------------------------------------------------------------


def chunk_tokens(seq: int, cp: int) -> int:
    """Tokens in each of the 2·cp chunks of a sequence: s / (2·cp); ValueError if uneven
    (make_layout refuses such a layout with a SpecError naming cp)."""
    if seq % (2 * cp):
        raise ValueError(f"seq={seq} does not split into 2*cp={2 * cp} equal chunks")
    return seq // (2 * cp)


def zigzag_chunks(cp: int, rank: int) -> tuple[int, int]:
    """The two chunks cp rank ``rank`` holds: rank and 2cp-1-rank (Llama 3's balancing)."""
    if not 0 <= rank < cp:
        raise ValueError(f"rank={rank} is not a cp rank 0..{cp - 1}")
    return rank, 2 * cp - 1 - rank


def rank_positions(seq: int, cp: int, rank: int, zigzag: bool = True) -> list[int]:
    """Token positions cp rank ``rank`` holds, ascending: its two zigzag chunks, or with
    ``zigzag=False`` the naive contiguous s/cp tokens rank·s/cp ..."""
    c = chunk_tokens(seq, cp)
    if not zigzag:
        return list(range(rank * 2 * c, (rank + 1) * 2 * c))
    first, second = zigzag_chunks(cp, rank)
    return [*range(first * c, (first + 1) * c), *range(second * c, (second + 1) * c)]


def gathered_positions(seq: int, cp: int) -> list[int]:
    """Positions of the keys after the all-gather, in its order: rank 0's positions, then
    rank 1's, ... (a causal mask over gathered keys is this permutation of the columns)."""
    return [p for r in range(cp) for p in rank_positions(seq, cp, r)]


def local_layout(lay: Layout) -> Layout:
    """The layout one cp rank runs outside attention: its s/cp tokens, cp = 1. Per-token
    costs of ``lay`` (tensor- and pipeline-parallel bytes, activations but attention's)
    are those of this layout."""
    return dataclasses.replace(lay, seq=lay.seq // lay.cp, cp=1)


# -- bytes ---------------------------------------------------------------------------


def kv_width(m: ModelShape, tp: int = 1) -> int:
    """Elements of K and V together per token on one tensor-parallel rank:
    2 · (kv_heads / tp) · head_dim; with latent attention every head's decompressed K and
    V, (heads / tp) · (qk_head_dim + v_head_dim): the attention kernel's inputs, which
    a context-parallel ring passes, come after the up projection."""
    if m.kv_heads % tp:
        raise ValueError(f"tp={tp} does not divide kv_heads={m.kv_heads}")
    return (m.kv_heads // tp) * (m.head_dim + m.v_head_dim)


def kv_gather_bytes(m: ModelShape, lay: Layout) -> int:
    """Bytes one rank sends in one layer's forward all-gather of K and V, per micro-batch:
    (cp-1) · b · (s/cp) · 2·kv_dim/tp · e (module docstring); 0 without cp."""
    if lay.cp == 1:
        return 0
    local = lay.micro_batch * (lay.seq // lay.cp) * kv_width(m, lay.tp)
    return (lay.cp - 1) * local * lay.dtype.activation_bytes


def kv_grad_bytes(m: ModelShape, lay: Layout) -> int:
    """Bytes one rank sends in one layer's backward reduce-scatter of dK and dV, per
    micro-batch: the all-gather's reverse moves the same chunks, (cp-1) of them."""
    return kv_gather_bytes(m, lay)


def cp_passes(recompute: str) -> int:
    """Forward K/V all-gathers per layer and micro-batch: 2 with full recompute (the layer
    runs forward again before its backward) and with per-operator checkpointing
    (``op``: the gathers' outputs are not among those it keeps), else 1. Selective
    recompute keeps the gathered K and V (the recomputed attention core's inputs) and
    gathers nothing again."""
    return 2 if recompute in ("full", "op") else 1


def cp_layer_bytes(m: ModelShape, lay: Layout, recompute: str | None = None) -> int:
    """Bytes one rank sends for one layer and micro-batch over a step: its forward gathers
    (:func:`cp_passes` of ``recompute``, default the layout's) and its backward
    reduce-scatter."""
    passes = cp_passes(lay.recompute if recompute is None else recompute)
    return passes * kv_gather_bytes(m, lay) + kv_grad_bytes(m, lay)


def cp_bytes_per_stage(m: ModelShape, lay: Layout, recompute: str | None = None) -> list[int]:
    """Bytes one rank of each pipeline rank sends per step for context parallelism: its
    layers (uneven stages included) x micro-batches x :func:`cp_layer_bytes` (``recompute``:
    as there)."""
    per_layer = cp_layer_bytes(m, lay, recompute)
    return [n * lay.microbatches * per_layer for n in layout_rank_layers(m, lay)]


def cp_bytes_per_step(m: ModelShape, lay: Layout) -> int:
    """The busiest pipeline rank's :func:`cp_bytes_per_stage` (bytes per step)."""
    return max(cp_bytes_per_stage(m, lay))


# -- activations ---------------------------------------------------------------------


def gathered_kv_bytes(m: ModelShape, lay: Layout) -> int:
    """Bytes of the other ranks' K and V that one layer keeps for backward per micro-batch:
    (cp-1)/cp · b · s · 2·kv_dim/tp · e (the attention kernel saves its whole K and V)."""
    if lay.cp == 1:
        return 0
    return (lay.micro_batch * (lay.seq - lay.seq // lay.cp) * kv_width(m, lay.tp)
            * lay.dtype.activation_bytes)


def cp_layer_activation_bytes(m: ModelShape, lay: Layout, *, dropout: bool = True,
                              moe_layer: bool = False, flash: bool = False,
                              eager: bool = False, modules: tuple[str, ...] = (),
                              rows: tuple[float, float] | None = None) -> float:
    """Bytes one layer saves for backward per micro-batch on one rank of a cp layout:
    :func:`~shardlab.estimate.activations.layer_activation_bytes` on the rank's s/cp
    tokens, with the attention-score terms (queries x keys) of s/cp queries against all s
    keys, plus the gathered K and V (:func:`gathered_kv_bytes`); full recompute keeps
    only the layer input, of s/cp tokens. Equal to the one-rank figure when cp = 1.
    ``rows``: a MoE layer's measured rows, as
    :func:`~shardlab.estimate.activations.layer_activation_bytes` takes them."""
    s, cp, b = lay.seq, lay.cp, lay.micro_batch
    local = s // cp
    e = lay.dtype.activation_bytes
    out = layer_activation_bytes(m, b, local, e, tp=lay.tp, sp=lay.sp, recompute=lay.recompute,
                                 dropout=dropout, moe_layer=moe_layer, flash=flash, eager=eager,
                                 ep=lay.ep, etp=lay.etp, capacity_factor=lay.capacity_factor,
                                 input_bytes=lay.dtype.input_bytes, modules=modules,
                                 combine_bytes=lay.dtype.combine_bytes, rows=rows)
    if cp == 1 or lay.recompute == "full":
        return out
    # The score terms above counted s/cp keys per query; a query meets all s of them.
    if not flash and lay.recompute != "selective":
        core = activation_terms(m, b, local, e, dropout, moe_layer, eager).attention_core
        out += (cp - 1) * core / lay.tp
    elif flash and eager and lay.recompute != "selective":
        out += (cp - 1) * 4.0 * b * local * local  # the CPU kernel's fp32 [b, 1, s/cp, s] mask
    return out + gathered_kv_bytes(m, lay)


# -- attention work ------------------------------------------------------------------


def causal_pairs(start: int, stop: int) -> int:
    """Query-key pairs of queries start .. stop-1 under a causal mask: sum of p + 1."""
    return (stop * (stop + 1) - start * (start + 1)) // 2


def rank_causal_pairs(seq: int, cp: int, rank: int, zigzag: bool = True) -> int:
    """Query-key pairs cp rank ``rank`` computes per sequence and head (its queries against
    every key at or before them). With the zigzag every rank gets (s² + s)/(2cp) exactly."""
    c = chunk_tokens(seq, cp)
    if not zigzag:
        return causal_pairs(rank * 2 * c, (rank + 1) * 2 * c)
    return sum(causal_pairs(k * c, (k + 1) * c) for k in zigzag_chunks(cp, rank))


def causal_imbalance(seq: int, cp: int, zigzag: bool = True) -> float:
    """The busiest cp rank's causal attention work over the mean rank's: 1 with the zigzag,
    and (2cp-1)/cp + O(1/s) with the naive contiguous split (module docstring)."""
    work = [rank_causal_pairs(seq, cp, r, zigzag) for r in range(cp)]
    return max(work) * cp / sum(work)


def cp_attention_flops(m: ModelShape, lay: Layout, rank: int = 0, zigzag: bool = True) -> int:
    """Forward FLOPs of Q·Kᵀ and scores·V one tensor-parallel rank of cp rank ``rank`` runs
    per layer and micro-batch: 2 · pairs · ((q_dim + o_dim)/tp) · b (4 · pairs · q_dim/tp
    without latent attention), with the exact causal pairs of
    :func:`rank_causal_pairs` (the flops module's ``causal=True`` counts s/2 keys per
    query instead of (s+1)/2). Summed over the cp ranks: the one-device figure."""
    pairs = rank_causal_pairs(lay.seq, lay.cp, rank, zigzag)
    return 2 * pairs * ((m.q_dim + m.o_dim) // lay.tp) * lay.micro_batch


# -- gradients over dp x cp ----------------------------------------------------------


def grad_group(lay: Layout) -> int:
    """Ranks a parameter's gradient is summed over: dp x cp (the cp ranks of a replica
    hold the same parameters)."""
    return lay.dp * lay.cp


def shard_group(lay: Layout) -> int:
    """Ranks ZeRO/FSDP shards a parameter over: dp_shard x cp (cp folded into the shard
    group as torchtitan does; the whole of dp x cp without HSDP): the dense group of
    :func:`~shardlab.estimate.states.zero_groups`."""
    return zero_groups(lay).dense


def grad_sync_bytes(params: int, policy: DtypePolicy, lay: Layout, position: int = 0,
                    replica: int = 0, group: int | None = None,
                    replicas: int | None = None) -> int:
    """Bytes one rank sends per step to sum ``params`` gradients over dp x cp and keep
    ZeRO's shards (exact, on :func:`~shardlab.estimate.comm.ring_chunks` of the flat
    buffer): ``position`` is the rank's place in its shard group, ``replica`` its
    replica under HSDP. ``group`` and ``replicas`` override the shard group's size
    (:func:`shard_group`) and the replicas (dp_replicate): a MoE model's routed experts
    shard over expert_dp in one replica group.

    ZeRO 0: a ring all-reduce over dp x cp. ZeRO 1-3 inside a shard group of G ranks: a
    reduce-scatter of the gradients, then, with R = dp_replicate > 1 (HSDP, FSDP2 on a
    2-D mesh), an all-reduce of the rank's chunk across the R replicas; then the updated
    weights all-gathered once (ZeRO 1-2) or the weights gathered for every micro-batch's
    forward and backward (ZeRO-3, 2m gathers)."""
    g = shard_group(lay) if group is None else group
    gb, wb = policy.grad_bytes, policy.weight_bytes
    if lay.zero == 0:
        return ring_allreduce_sent(params, g, position, gb)
    gathers = 1 if lay.zero in (1, 2) else 2 * lay.microbatches
    out = (ring_reduce_scatter_sent(params, g, position, gb)
           + gathers * ring_all_gather_sent(params, g, position, wb))
    r = lay.dp_replicate if replicas is None else replicas
    if r > 1:
        out += ring_allreduce_sent(ring_chunks(params, g)[position], r, replica, gb)
    return out
