"""Communication: bytes each rank sends per step, and alpha-beta times of ring collectives.

Ring algorithms on p ranks and an n-byte buffer (Thakur, Rabenseifner & Gropp
2005; Patarasuk & Yuan 2009), α the per-message latency, β = 1/bandwidth:

* all-reduce: 2(p-1)·α + 2·(p-1)/p·n·β; each rank sends 2·(p-1)/p·n bytes;
* reduce-scatter or all-gather: (p-1)·α + (p-1)/p·n·β; each rank sends (p-1)/p·n.

Those are the *mean* over the ranks, and every rank's figure when p divides the
element count. When it does not, the ring's chunks are whole elements of unequal
length and each rank sends its own integer count: :func:`ring_chunks`,
:func:`ring_allreduce_sent`, :func:`ring_reduce_scatter_sent` and
:func:`ring_all_gather_sent` give them exactly, and the per-step functions below take
``rank=`` to give one rank's exact bytes instead of the mean (``shardlab simulate``
holds every virtual device to them with tolerance 0). The plan, the budget and the
alpha-beta times keep the mean: at their sizes the ranks differ by a few elements.

Per training step, for Ψ parameters on a model-parallel rank (ZeRO paper,
Rajbhandari et al. 2020, Sec. 7): data parallel and ZeRO-1/2 move 2Ψ elements
(an all-reduce, or a reduce-scatter of gradients and an all-gather of updated
weights); ZeRO-3 moves 3Ψ (weights gathered for forward and again for backward,
gradients reduce-scattered). With m micro-batches ZeRO-3 (FSDP) gathers the
weights again for every micro-batch: 2m gathers per step. torch's FSDP2 pads every
parameter's dim 0 to a multiple of p before it gathers or reduce-scatters, so a real
FSDP2 rank sends exactly (p-1)/p of the *padded* bytes (:func:`fsdp2_padded_params`).

Tensor parallel (Megatron-LM, Shoeybi et al. 2019): per layer and micro-batch two
all-reduces of the b·s·h activations in forward and two in backward (sequence
parallel turns each into an all-gather plus a reduce-scatter: the same bytes);
full recompute runs the two forward ones again; see :func:`tp_bytes_per_stage` for
the embedding, the head and sequence parallelism's gradient all-reduce. Pipeline
parallel: each chunk boundary sends a b·s·h activation forward and its gradient
back per micro-batch, divided by t when tensor-parallel ranks split it (Narayanan
et al. 2021's scatter/gather optimisation).

Expert parallel (GShard, Lepikhin et al. 2020): the all-to-alls that dispatch tokens
to their experts and combine the outputs are their own kind, ``ep``
(:func:`shardlab.estimate.expert.expert_alltoall_bytes`). With ep > 1 the data-parallel
gradient traffic splits in two: the dense parameters over all dp ranks, the routed
experts only over the expert_dp = dp/ep ranks holding the same experts
(:func:`layout_dp_bytes`; torchtitan, Megatron-LM's expert data-parallel group).

Context parallel and HSDP (:func:`layout_dp_bytes`): gradients are summed over dp x cp
(the cp ranks hold the same parameters); ZeRO shards over the shard group of
:func:`shardlab.estimate.states.zero_groups` (dp_shard x cp) and, under HSDP, all-reduces
each rank's 1/G shard of the gradients across the dp_replicate replicas (FSDP2 on a 2-D
mesh: reduce-scatter inside the shard group, then all-reduce across replicas). The two
parts run on different links, so they are given apart. Tensor- and pipeline-parallel
bytes are per token: a cp rank sends those of its s/cp tokens. The K/V all-gathers of
context parallelism are :mod:`shardlab.estimate.context`'s, their own kind ``cp``.

Uneven pipeline stages (a Layout's ``stage_layers``) and the V placement of zb-v and
dualpipev (the head back on rank 0) place layers as
:func:`shardlab.estimate.partition.layout_rank_layers` does.

Every function gives what one rank sends; the simulator counts the same bytes per
virtual device and ``shardlab simulate`` checks them for equality.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.hardware import Link
from shardlab.config.layout import V_SCHEDULES, Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.params import qk_norm_params
from shardlab.estimate.partition import (
    chunk_rank,
    layer_replicated_params,
    layout_rank_layers,
    moe_layers_per_rank,
    rank_layers,
    vocab_rows,
)
from shardlab.estimate.states import zero_groups


def ring_allreduce_bytes(nbytes: float, p: int) -> float:
    """Bytes one rank sends in a ring all-reduce of ``nbytes``: 2(p-1)/p·n."""
    return 2.0 * (p - 1) / p * nbytes if p > 1 else 0.0


def ring_gather_bytes(nbytes: float, p: int) -> float:
    """Bytes one rank sends in a ring reduce-scatter or all-gather of ``nbytes``: (p-1)/p·n."""
    return (p - 1) / p * nbytes if p > 1 else 0.0


def ring_allreduce_seconds(nbytes: float, p: int, link: Link) -> float:
    """Alpha-beta time of a ring all-reduce: 2(p-1)α + 2(p-1)/p·n/bandwidth."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * link.latency + ring_allreduce_bytes(nbytes, p) / link.bandwidth


def ring_gather_seconds(nbytes: float, p: int, link: Link) -> float:
    """Alpha-beta time of a ring reduce-scatter or all-gather: (p-1)α + (p-1)/p·n/bandwidth."""
    if p <= 1:
        return 0.0
    return (p - 1) * link.latency + ring_gather_bytes(nbytes, p) / link.bandwidth


def alltoall_seconds(nbytes: float, p: int, link: Link, calls: int = 1,
                     inter: Link | None = None, per_node: int | None = None) -> float:
    """Alpha-beta time of ``calls`` all-to-alls in which one rank sends ``nbytes`` in all
    to its p - 1 peers (pairwise exchange, Thakur et al. 2005): calls·(p-1)·α + n·β on
    ``link``. A group with ``per_node`` = k < p members in each node sends the (k-1)/(p-1)
    for its node's peers on ``link`` and the rest on ``inter`` (one NIC) at once, the
    slower setting the time: calls·((k-1)·α + (p-k)·α_inter) + max of the two n·β
    (NVIDIA/nccl-tests issue 267: an all-to-all gets one NIC)."""
    if p <= 1:
        return 0.0
    k = p if inter is None or per_node is None else max(1, min(per_node, p))
    if k == p:
        return calls * (p - 1) * link.latency + nbytes / link.bandwidth
    assert inter is not None
    near, far = nbytes * (k - 1) / (p - 1), nbytes * (p - k) / (p - 1)
    return (calls * ((k - 1) * link.latency + (p - k) * inter.latency)
            + max(near / link.bandwidth, far / inter.bandwidth))


# ---------------------------------------------------------------------------
# Exact bytes per rank: the ring's chunks are whole elements
# ---------------------------------------------------------------------------


def ring_chunks(n: int, p: int) -> list[int]:
    """The p chunks a ring cuts n elements (or rows) into, as ``torch.tensor_split`` cuts
    them: the first n mod p chunks one element longer than the others. The simulator's
    collectives cut their buffers so, and ZeRO's flat shards are these chunks."""
    q, extra = divmod(n, p)
    return [q + (i < extra) for i in range(p)]


def _check_rank(rank: int, p: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < p:
        raise ValueError(f"rank={rank!r} is not a position 0..{p - 1} in a ring of {p}")


def ring_allreduce_sent(n: int, p: int, rank: int, item_bytes: int = 1) -> int:
    """Bytes ``rank`` sends in a ring all-reduce of n elements of ``item_bytes`` each.

    Patarasuk & Yuan 2009's ring (a ring reduce-scatter, then a ring all-gather, each
    the ring of Thakur, Rabenseifner & Gropp 2005) on the chunks c_0..c_{p-1} of
    :func:`ring_chunks`: in reduce-scatter step s = 0..p-2 rank r sends chunk
    (r - s) mod p to rank r + 1, which adds it to its own; in all-gather step s it sends
    chunk (r + 1 - s) mod p.
    Rank r sends every chunk but (r+1) mod p, then every chunk but (r+2) mod p:
    2n - c_{(r+1) mod p} - c_{(r+2) mod p} elements. That is 2(p-1)/p·n when p divides n;
    otherwise the ranks differ by an element or two and average to it. This is the order
    :func:`shardlab.sim.ring_steps.ring_all_reduce_steps` runs chunk by chunk; NCCL and
    gloo cut their buffers by their own rules (NCCL in fixed-size slices per channel),
    so for a real run the mean :func:`ring_allreduce_bytes` is the figure.
    """
    _check_rank(rank, p)
    if p == 1:
        return 0
    c = ring_chunks(n, p)
    return (2 * n - c[(rank + 1) % p] - c[(rank + 2) % p]) * item_bytes


def ring_reduce_scatter_sent(n: int, p: int, rank: int, item_bytes: int = 1) -> int:
    """Bytes ``rank`` sends in a ring reduce-scatter of n elements (or rows of
    ``item_bytes``) that leaves the sum of chunk r of :func:`ring_chunks` on rank r.

    Step s = 0..p-2: rank r sends chunk (r - 1 - s) mod p, so every chunk but its own:
    n - c_r elements (Thakur et al. 2005's ring; (p-1)/p·n when p divides n).
    """
    _check_rank(rank, p)
    if p == 1:
        return 0
    return (n - ring_chunks(n, p)[rank]) * item_bytes


def ring_all_gather_sent(n: int, p: int, rank: int, item_bytes: int = 1) -> int:
    """Bytes ``rank`` sends in a ring all-gather of the chunks of :func:`ring_chunks` of n
    elements (or rows of ``item_bytes``), rank r starting from chunk r.

    Step s = 0..p-2: rank r sends chunk (r - s) mod p, so every chunk but the last it
    receives, (r+1) mod p: n - c_{(r+1) mod p} elements ((p-1)/p·n when p divides n).
    """
    _check_rank(rank, p)
    if p == 1:
        return 0
    return (n - ring_chunks(n, p)[(rank + 1) % p]) * item_bytes


# ---------------------------------------------------------------------------
# Per step
# ---------------------------------------------------------------------------


def dp_bytes_per_step(params: float, policy: DtypePolicy, zero: int, dp: int,
                      microbatches: int = 1, rank: int | None = None) -> float:
    """Bytes one rank sends per step for data parallel / ZeRO ``zero`` (module docstring).

    Without ``rank``: the mean over the dp ranks, (p-1)/p of the bytes moved. With
    ``rank`` (``params`` a whole number): what data-parallel rank ``rank`` sends exactly
    when ZeRO shards the flat buffer of ``params`` elements as :func:`ring_chunks` (the
    simulator's flat shards; DeepSpeed pads its buffer to equal shards instead): ZeRO-0
    an all-reduce of the gradients, ZeRO-1/2 a reduce-scatter of them and an all-gather
    of the updated weights, ZeRO-3 2m all-gathers and a reduce-scatter.
    """
    if rank is not None:
        n = int(params)
        if n != params:
            raise ValueError(f"params={params!r}: an exact count needs a whole number")
        g, w = policy.grad_bytes, policy.weight_bytes
        if zero == 0:
            return ring_allreduce_sent(n, dp, rank, g)
        gathers = 1 if zero in (1, 2) else 2 * microbatches
        return (ring_reduce_scatter_sent(n, dp, rank, g)
                + gathers * ring_all_gather_sent(n, dp, rank, w))
    g = params * policy.grad_bytes
    w = params * policy.weight_bytes
    if zero == 0:
        return ring_allreduce_bytes(g, dp)
    if zero in (1, 2):
        return ring_gather_bytes(g + w, dp)
    return ring_gather_bytes(2 * microbatches * w + g, dp)


def layout_dp_bytes(dense: float, experts: float, layout: Layout, zero: int | None = None
                    ) -> tuple[float, float]:
    """(shard-group bytes, replica bytes) one rank sends per step to sum and shard the
    gradients of ``dense`` and routed-expert ``experts`` parameters (module docstring),
    ZeRO ``zero`` (default the layout's), the mean over the ranks.

    ZeRO 0: a ring all-reduce over dp x cp (expert_dp x cp for the experts), all in the
    first figure. ZeRO 1-3: :func:`dp_bytes_per_step` over the shard group G of
    :func:`~shardlab.estimate.states.zero_groups`; with R > 1 replicas (HSDP) each rank
    also all-reduces its G-th of the gradients across the R replicas: 2(R-1)/R·Ψ/G·g."""
    lay = layout
    z = lay.zero if zero is None else zero
    g = zero_groups(lay)
    p, m = lay.dtype, lay.microbatches
    if z == 0:
        return (dp_bytes_per_step(dense, p, 0, g.dense * g.replicas)
                + dp_bytes_per_step(experts, p, 0, g.experts * g.expert_replicas), 0.0)
    inside = (dp_bytes_per_step(dense, p, z, g.dense, m)
              + dp_bytes_per_step(experts, p, z, g.experts, m))
    across = (ring_allreduce_bytes(dense / g.dense * p.grad_bytes, g.replicas)
              + ring_allreduce_bytes(experts / g.experts * p.grad_bytes, g.expert_replicas))
    return inside, across


def attention_rows(m: ModelShape, tp: int) -> list[tuple[int, int]]:
    """(dim 0, elements per dim-0 row) of one block's tensors other than its MLP on one
    tensor-parallel rank: the two norms, the attention linears (column-parallel ones keep
    1/tp of their rows, row-parallel ones 1/tp of their columns, as torch's
    ``ColwiseParallel`` / ``RowwiseParallel``; latent attention's down projections whole),
    latent attention's and Qwen3's query/key norms (whole), and the attention's biases
    (q/k/v split, the output projection's whole). A dense block adds its MLP
    (:func:`tensor_rows`); a MoE block its router and experts
    (:func:`shardlab.train.report_moe.moe_padded_params`)."""
    d, q, kv = m.d_model, m.q_dim // tp, m.kv_dim // tp
    norm = [(d, 1)] * (2 if m.style == "gpt" else 1)  # LayerNorm: scale and shift
    # Each attention linear as torch stores it, [out, in].
    attn = [(x.d_out // tp, x.d_in) if x.split == "column"
            else (x.d_out, x.d_in // tp) if x.split == "row" else (x.d_out, x.d_in)
            for x in m.attention_linears]
    if m.mla is not None:  # the latents' norms, whole on every rank
        attn += [(n, 1) for n in (m.mla.q_lora_rank, m.mla.kv_lora_rank) if n]
    if m.qk_norm:  # Qwen3's query and key norms, whole on every rank
        attn += [(m.head_dim, 1)] * 2
    rows = [*norm, *attn, *norm]
    if m.biases or m.qkv_bias:
        rows += [(q, 1), (kv, 1), (kv, 1)]
    if m.biases:
        rows.append((d, 1))  # o_proj's
    return rows


def tensor_rows(m: ModelShape, tp: int, vocab_parallel: bool
                ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    """(dim 0, elements per dim-0 row) of every parameter tensor shardlab's LM holds on one
    tensor-parallel rank: one block's (:func:`attention_rows` and the MLP: column-parallel
    up and gate, row-parallel down, Megatron-LM's split), the first stage's extras
    (embedding, positions), the last stage's (final norm, head)."""
    d, f = m.d_model, m.d_ff // tp
    block = [*attention_rows(m, tp), (f, d), (d, f)]
    if m.biases:
        block += [(f, 1), (d, 1)]  # up_proj, down_proj
    if m.mlp_matrices == 3:
        block.append((f, d))  # gate_proj
    norm = [(d, 1)] * (2 if m.style == "gpt" else 1)
    vocab = vocab_rows(m, tp, vocab_parallel)
    first = [(vocab, d)] + ([(m.context, d)] if m.style == "gpt" else [])
    return block, first, [*norm, (vocab, d)]


def fsdp2_padded_params(m: ModelShape, tp: int, pp: int, dp: int, virtual_stages: int = 1,
                        vocab_parallel: bool = True, stage_layers: Sequence[int] = (),
                        position: int | None = None) -> list[int]:
    """Elements torch's FSDP2 gathers and reduce-scatters for one tensor-parallel rank of
    each pipeline rank: :func:`~shardlab.estimate.partition.stage_params` with every
    parameter's dim 0 padded to a multiple of dp.

    FSDP2 cuts each parameter (its tensor-parallel shard under 2-D) along dim 0 with
    ``torch.chunk`` and pads every rank's shard to the first chunk, ceil(rows/dp) rows
    (torch 2.13's ``FSDPParam._init_sharded_param``: ``padded_sharded_param_size =
    chunks[0].size()``). Every all-gather input is one padded shard and every reduce-scatter
    input dp of them, so each rank sends exactly (dp-1)/dp of these elements per
    collective, the same on every rank: the per-rank figure is uniform, with no
    chunk of unequal length. Dense models only (shardlab's LM builds no experts). ``dp``
    is the FSDP shard group (dp_shard x cp with context parallelism); ``stage_layers``
    an uneven split (a Layout's). With ``position`` (a rank's place in that group): the
    elements that rank holds instead (:func:`fsdp2_padded`).
    """
    if m.moe is not None:
        raise ValueError("fsdp2_padded_params: shardlab's LM builds no mixture-of-experts")
    block, first, last = tensor_rows(m, tp, vocab_parallel)
    out = []
    for r, layers in enumerate(rank_layers(m.layers, pp, virtual_stages, stage_layers)):
        n = layers * fsdp2_padded(block, dp, position)
        if r == 0:
            n += fsdp2_padded(first, dp, position)
        if r == pp - 1:
            n += fsdp2_padded(last[:-1] if m.tied and pp == 1 else last, dp, position)
        out.append(n)
    return out


def fsdp2_padded(tensors: list[tuple[int, int]], dp: int, position: int | None = None) -> int:
    """Elements of ``tensors`` (dim 0, elements per dim-0 row) as FSDP2 shards them over
    ``dp`` ranks: each tensor's dim 0 padded up to a multiple of dp
    (:func:`fsdp2_padded_params`). With ``position``: the elements the rank at that place
    of the group holds, its ``torch.chunk`` of each tensor: min(c, max(0, rows - position·c))
    rows of c = ceil(rows/dp) (the first ranks hold whole chunks, the last may hold less or
    none; the padding is not a parameter's)."""
    if position is None:
        return sum(-(-rows // dp) * dp * width for rows, width in tensors)
    return sum(min(-(-rows // dp), max(0, rows - position * -(-rows // dp))) * width
               for rows, width in tensors)


def experts_cut_on_dim1(local: int, shards: int, width_split: bool) -> bool:
    """Whether FSDP2 shards a rank's ``local`` experts (their [E_local, ...] weights) over
    ``shards`` ranks on dim 1 (an expert's d or f, every expert cut alike) rather than on
    dim 0, which FSDP2 pads to a multiple of the shards (1 local expert over 8 would be
    held and gathered as 8): when there are fewer local experts than shards, torchtitan's
    rule (``efsdp * ep > num_experts``: ``Shard(1)``, torchtitan/models/*/infra/
    parallelize.py). ``width_split``: experts already cut over tp (etp = tp) keep dim 0."""
    return not width_split and local < shards


def tp_bytes_per_stage(m: ModelShape, layout: Layout, vocab_parallel: bool = True,
                       rank: int | None = None) -> list[float]:
    """Bytes one tensor-parallel rank of each pipeline stage sends per step.

    Per layer and micro-batch 4 all-reduces of b·s·h (6 with full recompute; sequence
    parallel sends the same bytes as all-gathers and reduce-scatters); half of them in a
    MoE layer without shared experts or sequence parallelism whose experts are whole on
    every tensor rank (etp = 1). Around the
    layers, per micro-batch: with a vocabulary-parallel embedding and head (Megatron),
    one all-reduce-worth each on the first and the last stage; with both kept whole on
    every rank (``vocab_parallel=False``, the simulator), nothing without sequence
    parallelism, and with it one all-gather on each: the embedding output's scatter
    is gathered back in backward, the last layer's output is gathered for the head.
    With sequence parallelism the gradients of the norms and row-parallel biases are
    all-reduced once per step; Qwen3's query/key norms (``qk_norm``) see only the rank's
    heads, so theirs are all-reduced once per step without it too.

    Without ``rank`` the mean over the tensor-parallel ranks; with it, what tensor rank
    ``rank`` sends exactly on the ring's chunks (the all-reduces cut the flattened
    b·s·h activation, the sequence collectives cut the sequence). With context
    parallelism s is the rank's s/cp tokens; the layers of each rank follow uneven
    stages, and the head sits with the last chunk (rank 0 in a V).
    """
    lay, t = layout, layout.tp
    if t == 1:
        return [0.0] * lay.pp
    seq = lay.seq // lay.cp
    ab = lay.dtype.activation_bytes
    row = lay.micro_batch * m.d_model * ab  # one sequence position of the micro-batch

    def all_reduce(elements: int, item: int) -> float:
        if rank is None:
            return ring_allreduce_bytes(elements * item, t)
        return ring_allreduce_sent(elements, t, rank, item)

    def gather(rows: int, row_bytes: int) -> float:  # an all-gather along the sequence
        if rank is None:
            return ring_gather_bytes(rows * row_bytes, t)
        return ring_all_gather_sent(rows, t, rank, row_bytes)

    if lay.sp and rank is not None:  # exactly: an all-gather and a reduce-scatter
        per_call: float = gather(seq, row) + ring_reduce_scatter_sent(seq, t, rank, row)
    else:
        per_call = all_reduce(lay.micro_batch * seq * m.d_model, ab)
    per_layer = 6 if lay.recompute == "full" else 4
    v_shape = lay.schedule in V_SCHEDULES
    head = chunk_rank(lay.pp * lay.virtual_stages - 1, lay.pp, v_shape)
    # A MoE layer with no shared experts, its experts whole on every tensor rank (etp = 1)
    # and no sequence parallelism has no tensor-parallel MLP: the tensor ranks route the
    # same tokens, so only the attention's collectives remain (half of the layer's). With
    # etp = tp the experts' partial outputs are still reduced, as a dense MLP's.
    whole = m.moe is not None and not m.moe.shared_experts and lay.etp == 1 and not lay.sp
    moe = (moe_layers_per_rank(m, lay.pp, lay.virtual_stages, lay.stage_layers, v_shape)
           if whole else [0] * lay.pp)
    out = []
    for r, layers in enumerate(layout_rank_layers(m, lay)):
        ends = (r == 0) + (r == head)
        nbytes = lay.microbatches * per_layer * (layers - moe[r] / 2) * per_call
        if vocab_parallel:
            nbytes += lay.microbatches * ends * per_call
        elif lay.sp:
            # The embedding's split is gathered back in backward; the head's gather runs in
            # forward, twice when the whole stage is recomputed.
            gathers = (r == 0) + (r == head) * (2 if lay.recompute == "full" else 1)
            nbytes += lay.microbatches * gathers * gather(seq, row)
        if lay.sp:
            nbytes += all_reduce(layers * layer_replicated_params(m), lay.dtype.grad_bytes)
        elif m.qk_norm:  # partial over each rank's heads, sequence parallel or not
            nbytes += all_reduce(layers * qk_norm_params(m), lay.dtype.grad_bytes)
        out.append(nbytes)
    return out


def pp_messages_per_rank(pp: int, virtual_stages: int = 1) -> list[int]:
    """Point-to-point sends per micro-batch of each rank: forward out of every chunk but the
    last, backward out of every chunk but the first (chunk c on rank c mod pp)."""
    chunks = pp * virtual_stages
    sends = [0] * pp
    for c in range(chunks):
        sends[c % pp] += (c < chunks - 1) + (c > 0)
    return sends


def pp_bytes_per_rank(m: ModelShape, layout: Layout, split_by_tp: bool = True,
                      element_bytes: float | None = None) -> list[float]:
    """Bytes each pipeline rank sends per step (activations forward, gradients back).

    Each tensor-parallel rank sends b·s·h/t (Megatron's scatter/gather, or sequence
    parallel's natural shard); ``split_by_tp=False`` sends the whole b·s·h from each. A
    context-parallel rank sends its s/cp tokens' activations. ``element_bytes``: bytes of
    an element of the stage's output (default the layout's activation bytes; 4 for bf16
    under autocast, whose residual stream is fp32).
    """
    lay = layout
    elem = lay.dtype.activation_bytes if element_bytes is None else element_bytes
    act = lay.micro_batch * (lay.seq // lay.cp) * m.d_model * elem
    if split_by_tp:
        act /= lay.tp
    return [n * lay.microbatches * act for n in pp_messages_per_rank(lay.pp, lay.virtual_stages)]


def embedding_sync_bytes(m: ModelShape, layout: Layout, vocab_parallel: bool = True) -> float:
    """Bytes the first and the last stage each send per step to keep a tied embedding and
    head equal when they sit on different stages: an all-reduce of the embedding gradient
    between the two (Megatron-LM's embedding group); zero otherwise."""
    if not m.tied or layout.pp == 1:
        return 0.0
    rows = vocab_rows(m, layout.tp, vocab_parallel)
    return ring_allreduce_bytes(rows * m.d_model * layout.dtype.grad_bytes, 2)
