"""How a model's layers and parameters fall on pipeline stages and tensor-parallel ranks.

Megatron-LM's placement (Shoeybi et al. 2019; Narayanan et al. 2021): column- and
row-parallel weights and column-parallel biases are split over tp; norms and the
bias of each row-parallel layer are replicated; the embedding and an untied head
are split over the vocabulary; learned positions are replicated. The first
pipeline stage holds the embedding (and positions), the last the final norm and
the head; with a tied head and pp > 1 the last stage keeps its own copy of the
embedding, as Megatron does. Vocabulary padding to a multiple of tp is ignored.
"""

from __future__ import annotations

from shardlab.config.model import ModelShape
from shardlab.estimate.params import attention_params, mlp_params, norm_params, router_params


def chunk_layers(layers: int, pp: int, virtual_stages: int = 1) -> list[int]:
    """Layers in each of the pp*v model chunks, the first chunks one larger when uneven."""
    chunks = pp * virtual_stages
    base, extra = divmod(layers, chunks)
    return [base + 1] * extra + [base] * (chunks - extra)


def rank_layers(layers: int, pp: int, virtual_stages: int = 1) -> list[int]:
    """Layers each pipeline rank holds: chunk c lives on rank c mod pp (interleaved placement),
    so rank r holds v chunks of ``base`` layers plus one more for each of its chunks
    r, r + pp, ... below ``extra`` (:func:`chunk_layers`)."""
    base, extra = divmod(layers, pp * virtual_stages)
    return [virtual_stages * base + min(virtual_stages, max(0, -(-(extra - r) // pp)))
            for r in range(pp)]


def _split(total: int, replicated: int, tp: int) -> int:
    """Per-rank count of a block whose ``replicated`` part is copied and the rest split by tp."""
    return (total - replicated) // tp + replicated


def layer_params_per_tp_rank(m: ModelShape, tp: int, moe_layer: bool) -> int:
    """Parameters of one layer on one tensor-parallel rank."""
    bias = m.d_model if m.biases else 0  # row-parallel output bias: replicated
    n = _split(attention_params(m), bias, tp) + 2 * norm_params(m)
    if moe_layer and m.moe is not None:
        e = m.moe
        experts = e.experts * mlp_params(m, e.expert_d_ff)
        shared = e.shared_experts * mlp_params(m, e.shared_d_ff)
        n += _split(experts + shared, bias * (e.experts + e.shared_experts), tp)
        n += router_params(m)
    else:
        n += _split(mlp_params(m, m.d_ff), bias, tp)
    return n


def layer_replicated_params(m: ModelShape) -> int:
    """Parameters of one dense layer that every tensor-parallel rank holds in full: the two
    norms and the row-parallel biases (attention output, MLP down). Under sequence
    parallelism each rank sees only part of the sequence, so their gradients are partial
    and need an all-reduce over the tensor-parallel group (Korthikanti et al. 2022)."""
    return 2 * norm_params(m) + (2 * m.d_model if m.biases else 0)


def stage_params(m: ModelShape, tp: int, pp: int, virtual_stages: int = 1,
                 vocab_parallel: bool = True) -> list[int]:
    """Parameters on one tensor-parallel rank of each pipeline rank (what ZeRO then shards).

    ``vocab_parallel=False`` keeps the embedding and head whole on every tensor-parallel
    rank (as shardlab's simulator does) instead of splitting the vocabulary.
    """
    vocab_shard = (-(-m.vocab // tp) if vocab_parallel else m.vocab) * m.d_model
    out = []
    # Dense layers come first (DeepSeek-style MoE keeps its dense layers at the bottom).
    # Every dense layer is alike, and every MoE layer: count them per chunk, one product
    # each, so the cost grows with the chunks and not with the layers.
    dense_params = layer_params_per_tp_rank(m, tp, moe_layer=False)
    if not m.moe_layers:
        per_rank = [n * dense_params for n in rank_layers(m.layers, pp, virtual_stages)]
    else:
        moe_params = layer_params_per_tp_rank(m, tp, moe_layer=True)
        dense_left = m.dense_layers
        per_rank = [0] * pp
        start = 0
        for c, n in enumerate(chunk_layers(m.layers, pp, virtual_stages)):
            dense = max(0, min(n, dense_left - start))
            per_rank[c % pp] += dense * dense_params + (n - dense) * moe_params
            start += n
    for r in range(pp):
        n = per_rank[r]
        if r == 0:
            n += vocab_shard + (m.context * m.d_model if m.style == "gpt" else 0)
        if r == pp - 1:
            n += norm_params(m)
            if not m.tied or pp > 1:
                n += vocab_shard
        out.append(n)
    return out
