"""What the search tries beyond dp x tp x pp and the schedule: context-parallel degrees,
HSDP replica counts and uneven pipeline splits (:mod:`shardlab.plan.space` lists them per
mesh).

**Context parallel** (cp, its own mesh dimension: devices = dp x cp x tp x pp) when
sequences are long: every cp dividing the devices left by tp that cuts the sequence into
2·cp equal chunks and leaves each rank at least :data:`CP_MIN_TOKENS` tokens of it
(:func:`cp_choices`).

**HSDP** (dp_replicate R > 1: R replicas of dp/R shards) with the shard group kept within
a node, the FSDP2 default of torchtitan and fms-fsdp ("will shard your model across 8
gpus in each node"): R = dp / s for the largest s dividing dp with s·cp·tp <= devices
per node, when that leaves both a shard group of more than one rank and more than one
replica (:func:`replica_choices`).

**Expert parallel** (mixture of experts): every ep dividing dp and the experts, with the
experts split over tp (etp = tp) or whole (etp = 1) (:func:`expert_choices`).

**Uneven pipeline stages**: beside the even split, the first and the last model chunk k
layers fewer (:func:`fewer_at_ends`, torchtitan's ``first/last_stage_less_layers`` rule,
Megatron-LM's ``--account-for-embedding/loss-in-pipeline-split`` at k = 1; Llama 3 405B's
7 + 14 x 8 + 7), for each k that gives a split other than the even one
(:func:`fewer_at_ends_ks`).
"""

from __future__ import annotations

import math
from functools import lru_cache

from shardlab.config.model import ModelShape
from shardlab.estimate.partition import chunk_layers

CP_MIN_TOKENS = 4096
"""Fewest tokens of a sequence the default search leaves on each context-parallel rank
(NeMo's Llama 3 8B recipe runs cp 2 at sequence 8,192; Llama 3's long-context training cp
16 at 131,072, 8,192 each): below that, K/V gathers and smaller matmuls cost more than
the memory cp saves."""



@lru_cache(maxsize=65536)
def fewer_at_ends(layers: int, chunks: int, k: int) -> tuple[int, ...] | None:
    """Layers of each of ``chunks`` model chunks with the first and the last chunk ``k``
    layers fewer, torchtitan's rule (``generate_llm_fqn_per_model_part`` with
    first/last_stage_less_layers = k): the even split of layers + 2k (the first chunks
    one larger when uneven), then k off each end; None when an end chunk would be empty
    or there is one chunk. 126 layers, 16 chunks, k = 1: 7 + 14 x 8 + 7 (Llama 3 405B,
    :mod:`shardlab.plan.stages`)."""
    if chunks < 2 or k < 1:
        return None
    out = chunk_layers(layers + 2 * k, chunks)
    out[0] -= k
    out[-1] -= k
    return tuple(out) if min(out) >= 1 else None


def _end_value(layers: int, chunks: int, k: int, i: int) -> int:
    """Layers of chunk ``i`` of :func:`fewer_at_ends` (k = 0: the even split)."""
    q, r = divmod(layers + 2 * k, chunks)
    return q + (i < r) - k * ((i == 0) + (i == chunks - 1))


@lru_cache(maxsize=65536)
def fewer_at_ends_ks(layers: int, chunks: int, ks: tuple[int, ...]) -> tuple[int, ...]:
    """The k's of ``ks`` whose :func:`fewer_at_ends` split exists and differs from the even
    split, in O(1) each: both splits are their ends plus a middle that steps down by at
    most one layer, so equal sums and equal layers at chunks 0, 1, C-2 and C-1 make them
    the same split (with 2 chunks, the k comes straight back: always the even one)."""
    out = []
    for k in ks:
        if k < 1 or chunks < 2 or (layers + 2 * k) // chunks < k + 1:
            continue
        at = {0, min(1, chunks - 1), max(0, chunks - 2), chunks - 1}
        if any(_end_value(layers, chunks, k, i) != _end_value(layers, chunks, 0, i)
               for i in at):
            out.append(k)
    return tuple(out)


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (pairs d, n/d up to sqrt(n): fast for any n <= 2^20)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def cp_choices(devices: int, seq: int, given: tuple[int, ...] | None = None) -> list[int]:
    """Context-parallel degrees of a mesh with ``devices`` left after tp (module
    docstring): those of ``given`` (default: every divisor keeping :data:`CP_MIN_TOKENS`
    tokens of the sequence per rank) that divide ``devices`` and cut ``seq`` into 2·cp
    equal chunks."""
    allowed = divisors(devices) if given is None else [c for c in given if devices % c == 0]
    return [c for c in allowed if c == 1 or (seq % (2 * c) == 0 and (
        given is not None or seq // c >= CP_MIN_TOKENS))]


def replica_choices(dp: int, cp: int, tp: int, gpus_per_node: int,
                    given: tuple[int, ...] | None = None) -> list[int]:
    """HSDP replica counts of a mesh (module docstring): 1, and R = dp / s for the largest
    s dividing dp with s·cp·tp within a node (those of ``given`` that divide dp instead)."""
    if given is not None:
        return [r for r in given if dp % r == 0]
    s = math.gcd(dp, max(1, gpus_per_node // (cp * tp)))
    within = s * cp * tp <= gpus_per_node
    return [1] + ([dp // s] if within and s * cp > 1 and dp // s > 1 else [])


def split_choices(layers: int, pp: int, v: int, fixed: tuple[int, ...] = (),
                  ks: tuple[int, ...] = (1, 2)) -> list[tuple[int, ...]]:
    """The layer splits of a pipeline of pp x v chunks: ``fixed`` when given (only where
    its length is pp·v; else none), else the even split ``()`` and :func:`fewer_at_ends`
    for each k of ``ks`` that gives another."""
    chunks = pp * v
    if fixed:
        return [fixed] if len(fixed) == chunks else []
    if pp == 1:
        return [()]
    return [(), *(fewer_at_ends(layers, chunks, k)  # type: ignore[misc]
                  for k in fewer_at_ends_ks(layers, chunks, ks))]


def expert_choices(model: ModelShape, dp: int, tp: int, eps: tuple[int, ...] | None = None,
                   cp: int = 1, fold: bool = False) -> list[tuple[int, int]]:
    """(ep, etp) pairs a mesh of ``dp`` x ``cp`` x ``tp`` allows (module docstring): (1, tp)
    for a dense model; else each ep dividing the experts (of ``eps`` when given) and dp with
    etp = tp, then etp = 1 when tp > 1. With ``fold`` (the framework's expert layers take
    their own mesh: :attr:`~shardlab.plan.overlap.Framework.expert_fold`) ep divides
    dp·cp with etp = tp and dp·cp·tp with etp = 1."""
    if model.moe is None:
        return [(1, tp)]
    experts = model.moe.experts

    def eps_of(ranks: int) -> list[int]:
        return [e for e in divisors(ranks) if experts % e == 0 and (eps is None or e in eps)]

    if not fold:
        out = [(e, tp) for e in eps_of(dp)]
        return out + ([(e, 1) for e, _ in out] if tp > 1 else [])
    return [(e, tp) for e in eps_of(dp * cp)] + (
        [(e, 1) for e in eps_of(dp * cp * tp)] if tp > 1 else [])
