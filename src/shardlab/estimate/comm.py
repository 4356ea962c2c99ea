"""Communication: bytes each rank sends per step, and alpha-beta times of ring collectives.

Ring algorithms on p ranks and an n-byte buffer (Thakur, Rabenseifner & Gropp
2005; Patarasuk & Yuan 2009), α the per-message latency, β = 1/bandwidth:

* all-reduce: 2(p-1)·α + 2·(p-1)/p·n·β; each rank sends 2·(p-1)/p·n bytes;
* reduce-scatter or all-gather: (p-1)·α + (p-1)/p·n·β; each rank sends (p-1)/p·n.

Per training step, for Ψ parameters on a model-parallel rank (ZeRO paper,
Rajbhandari et al. 2020, Sec. 7): data parallel and ZeRO-1/2 move 2Ψ elements
(an all-reduce, or a reduce-scatter of gradients and an all-gather of updated
weights); ZeRO-3 moves 3Ψ (weights gathered for forward and again for backward,
gradients reduce-scattered). With m micro-batches ZeRO-3 (FSDP) gathers the
weights again for every micro-batch: 2m gathers per step.

Tensor parallel (Megatron-LM, Shoeybi et al. 2019): per layer and micro-batch two
all-reduces of the b·s·h activations in forward and two in backward (sequence
parallel turns each into an all-gather plus a reduce-scatter: the same bytes);
full recompute runs the two forward ones again; see :func:`tp_bytes_per_stage` for
the embedding, the head and sequence parallelism's gradient all-reduce. Pipeline
parallel: each chunk boundary sends a b·s·h activation forward and its gradient
back per micro-batch, divided by t when tensor-parallel ranks split it (Narayanan
et al. 2021's scatter/gather optimisation).

Every function gives what one rank sends; the simulator counts the same bytes per
virtual device and ``shardlab simulate`` checks them for equality.
"""

from __future__ import annotations

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.hardware import Link
from shardlab.config.layout import Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.partition import layer_replicated_params, rank_layers


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


def dp_bytes_per_step(params: float, policy: DtypePolicy, zero: int, dp: int,
                      microbatches: int = 1) -> float:
    """Bytes one rank sends per step for data parallel / ZeRO ``zero`` (module docstring)."""
    g = params * policy.grad_bytes
    w = params * policy.weight_bytes
    if zero == 0:
        return ring_allreduce_bytes(g, dp)
    if zero in (1, 2):
        return ring_gather_bytes(g + w, dp)
    return ring_gather_bytes(2 * microbatches * w + g, dp)


def tp_bytes_per_stage(m: ModelShape, layout: Layout, vocab_parallel: bool = True
                       ) -> list[float]:
    """Bytes one tensor-parallel rank of each pipeline stage sends per step.

    Per layer and micro-batch 4 all-reduces of b·s·h (6 with full recompute; sequence
    parallel sends the same bytes as all-gathers and reduce-scatters). Around the
    layers, per micro-batch: with a vocabulary-parallel embedding and head (Megatron),
    one all-reduce-worth each on the first and the last stage; with both kept whole on
    every rank (``vocab_parallel=False``, the simulator), nothing without sequence
    parallelism, and with it one all-gather on each: the embedding output's scatter
    is gathered back in backward, the last layer's output is gathered for the head.
    With sequence parallelism the gradients of the norms and row-parallel biases are
    all-reduced once per step.
    """
    lay, t = layout, layout.tp
    if t == 1:
        return [0.0] * lay.pp
    act = lay.micro_batch * lay.seq * m.d_model * lay.dtype.activation_bytes
    per_layer = 6 if lay.recompute == "full" else 4
    out = []
    for r, layers in enumerate(rank_layers(m.layers, lay.pp, lay.virtual_stages)):
        ends = (r == 0) + (r == lay.pp - 1)
        calls = lay.microbatches * per_layer * layers
        nbytes = calls * ring_allreduce_bytes(act, t)
        if vocab_parallel:
            nbytes += lay.microbatches * ends * ring_allreduce_bytes(act, t)
        elif lay.sp:
            # The embedding's split is gathered back in backward; the head's gather runs in
            # forward, twice when the whole stage is recomputed.
            gathers = (r == 0) + (r == lay.pp - 1) * (2 if lay.recompute == "full" else 1)
            nbytes += lay.microbatches * gathers * ring_gather_bytes(act, t)
        if lay.sp:
            grads = layers * layer_replicated_params(m) * lay.dtype.grad_bytes
            nbytes += ring_allreduce_bytes(grads, t)
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


def pp_bytes_per_rank(m: ModelShape, layout: Layout, split_by_tp: bool = True) -> list[float]:
    """Bytes each pipeline rank sends per step (activations forward, gradients back).

    Each tensor-parallel rank sends b·s·h/t (Megatron's scatter/gather, or sequence
    parallel's natural shard); ``split_by_tp=False`` sends the whole b·s·h from each.
    """
    lay = layout
    act = lay.micro_batch * lay.seq * m.d_model * lay.dtype.activation_bytes
    if split_by_tp:
        act /= lay.tp
    return [n * lay.microbatches * act for n in pp_messages_per_rank(lay.pp, lay.virtual_stages)]


def embedding_sync_bytes(m: ModelShape, layout: Layout, vocab_parallel: bool = True) -> float:
    """Bytes the first and the last stage each send per step to keep a tied embedding and
    head equal when they sit on different stages: an all-reduce of the embedding gradient
    between the two (Megatron-LM's embedding group); zero otherwise."""
    if not m.tied or layout.pp == 1:
        return 0.0
    rows = -(-m.vocab // layout.tp) if vocab_parallel else m.vocab
    return ring_allreduce_bytes(rows * m.d_model * layout.dtype.grad_bytes, 2)
