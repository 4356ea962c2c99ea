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
full recompute runs the two forward ones again. Pipeline parallel: each chunk
boundary sends a b·s·h activation forward and its gradient back per micro-batch,
divided by t when tensor-parallel ranks split it (Narayanan et al. 2021's
scatter/gather optimisation).
"""

from __future__ import annotations

from shardlab.spec.dtypes import DtypePolicy
from shardlab.spec.hardware import Link
from shardlab.spec.layout import Layout
from shardlab.spec.model import ModelShape


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


def tp_bytes_per_step(m: ModelShape, layout: Layout, layers: int) -> float:
    """Bytes one tensor-parallel rank sends per step for ``layers`` layers (module docstring).

    One more all-reduce per micro-batch is counted for the vocabulary-parallel
    embedding's output (first stage) or the head's input gradient (last stage).
    """
    lay = layout
    if lay.tp == 1:
        return 0.0
    act = lay.micro_batch * lay.seq * m.d_model * lay.dtype.activation_bytes
    per_layer = 6 if lay.recompute == "full" else 4
    calls = lay.microbatches * (per_layer * layers + 1)
    return calls * ring_allreduce_bytes(act, lay.tp)


def pp_messages_per_rank(pp: int, virtual_stages: int = 1) -> list[int]:
    """Point-to-point sends per micro-batch of each rank: forward out of every chunk but the
    last, backward out of every chunk but the first (chunk c on rank c mod pp)."""
    chunks = pp * virtual_stages
    sends = [0] * pp
    for c in range(chunks):
        sends[c % pp] += (c < chunks - 1) + (c > 0)
    return sends


def pp_bytes_per_step(m: ModelShape, layout: Layout) -> float:
    """Bytes the busiest pipeline rank sends per step (activations forward, gradients back)."""
    lay = layout
    if lay.pp == 1:
        return 0.0
    act = lay.micro_batch * lay.seq * m.d_model * lay.dtype.activation_bytes / lay.tp
    return max(pp_messages_per_rank(lay.pp, lay.virtual_stages)) * lay.microbatches * act
