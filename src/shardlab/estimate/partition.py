"""How a model's layers and parameters fall on pipeline stages and tensor-parallel ranks.

Megatron-LM's placement (Shoeybi et al. 2019; Narayanan et al. 2021): column- and
row-parallel weights and column-parallel biases are split over tp; norms and the
bias of each row-parallel layer are replicated; the embedding and an untied head
are split over the vocabulary; learned positions are replicated. The first
pipeline stage holds the embedding (and positions), the last the final norm and
the head; with a tied head and pp > 1 the last stage keeps its own copy of the
embedding, as Megatron does. Vocabulary padding to a multiple of tp is ignored.

Model chunks (pp x virtual_stages of them) get the layers of a Layout's ``stage_layers``
when it gives them (uneven stages: Megatron-LM's ``--pipeline-model-parallel-layout``,
torchtitan's ``first_stage_less_layers``; Llama 3 405B's first and last stages hold one
layer fewer), else the even split; chunk c lives on rank c mod pp, or in a V for zb-v
and dualpipev (then the head returns to rank 0). The ``layout_*`` functions read all of
that from a Layout.

Mixture-of-experts layers: the routed experts are split over the ep expert-parallel
ranks (experts/ep whole experts each, GShard, Lepikhin et al. 2020) and each expert's
width over etp (1: whole experts; tp: split as the dense MLP is, Megatron-LM's
``--expert-tensor-parallel-size``); the router stays whole on every rank and the
shared experts are split over tp like the dense MLP (torchtitan, Megatron-LM).
"""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.config.layout import V_SCHEDULES, Layout
from shardlab.config.model import ModelShape
from shardlab.estimate.params import (
    attention_params,
    duplicated_attention_params,
    mlp_params,
    mtp_params,
    norm_params,
    router_params,
    shared_expert_params,
)


def chunk_layers(layers: int, pp: int, virtual_stages: int = 1,
                 stage_layers: Sequence[int] = ()) -> list[int]:
    """Layers in each of the pp*v model chunks: ``stage_layers`` when given (a Layout's
    uneven split, validated by :func:`shardlab.config.layout.make_layout`), else the even
    split with the first chunks one larger."""
    chunks = pp * virtual_stages
    if stage_layers:
        if len(stage_layers) != chunks or sum(stage_layers) != layers:
            raise ValueError(f"stage_layers {tuple(stage_layers)} must give {chunks} counts "
                             f"summing to {layers}")
        return list(stage_layers)
    base, extra = divmod(layers, chunks)
    return [base + 1] * extra + [base] * (chunks - extra)


def chunk_rank(c: int, pp: int, v_shape: bool = False) -> int:
    """The pipeline rank model chunk c lives on: c mod pp (interleaved placement), or in a V
    (``v_shape``, zb-v and dualpipev: down the ranks and back up, c < pp on rank c, the
    rest on 2pp - 1 - c)."""
    if v_shape:
        return c if c < pp else 2 * pp - 1 - c
    return c % pp


def rank_layers(layers: int, pp: int, virtual_stages: int = 1,
                stage_layers: Sequence[int] = (), v_shape: bool = False) -> list[int]:
    """Layers each pipeline rank holds: the sum of its chunks' (:func:`chunk_layers`,
    placed by :func:`chunk_rank`). The even split in closed form, so the cost does not
    grow with the chunks: rank r holds v chunks of ``base`` layers plus one more for each
    of its chunks r, r + pp, ... below ``extra``."""
    if stage_layers or (v_shape and layers % (pp * virtual_stages)):
        out = [0] * pp
        for c, n in enumerate(chunk_layers(layers, pp, virtual_stages, stage_layers)):
            out[chunk_rank(c, pp, v_shape)] += n
        return out
    base, extra = divmod(layers, pp * virtual_stages)
    return [virtual_stages * base + min(virtual_stages, max(0, -(-(extra - r) // pp)))
            for r in range(pp)]


def layout_chunk_layers(m: ModelShape, lay: Layout) -> list[int]:
    """:func:`chunk_layers` of a Layout: its ``stage_layers``, or the even split."""
    return chunk_layers(m.layers, lay.pp, lay.virtual_stages, lay.stage_layers)


def layout_rank_layers(m: ModelShape, lay: Layout) -> list[int]:
    """:func:`rank_layers` of a Layout: its ``stage_layers`` placed as its schedule places
    chunks (in a V for zb-v and dualpipev)."""
    return rank_layers(m.layers, lay.pp, lay.virtual_stages, lay.stage_layers,
                       lay.schedule in V_SCHEDULES)


def _split(total: int, replicated: int, tp: int) -> int:
    """Per-rank count of a block whose ``replicated`` part is copied and the rest split by tp."""
    return (total - replicated) // tp + replicated


def expert_layer_params(m: ModelShape, ep: int = 1, etp: int = 1) -> int:
    """Routed-expert parameters of one MoE layer on one rank: experts/ep experts, each
    split over etp (its row-parallel output bias replicated); 0 for a dense model."""
    if m.moe is None:
        return 0
    local = m.moe.experts // ep
    bias = m.d_model if m.biases else 0
    return _split(local * mlp_params(m, m.moe.expert_d_ff), bias * local, etp)


def layer_params_per_tp_rank(m: ModelShape, tp: int, moe_layer: bool, ep: int = 1,
                             etp: int | None = None) -> int:
    """Parameters of one layer on one tensor-parallel rank (routed experts: one ep rank's
    share, each split over ``etp``, default tp)."""
    bias = m.d_model if m.biases else 0  # row-parallel output bias: replicated
    # So are the query/key norms' scales (one head_dim each, every head and rank) and
    # latent attention's down projections and latent norms.
    n = (_split(attention_params(m), bias + duplicated_attention_params(m), tp)
         + 2 * norm_params(m))
    if moe_layer and m.moe is not None:
        e = m.moe
        n += _split(shared_expert_params(m), bias if e.shared_experts else 0, tp)
        n += expert_layer_params(m, ep, tp if etp is None else etp) + router_params(m)
    else:
        n += _split(mlp_params(m, m.d_ff), bias, tp)
    return n


def moe_layers_per_rank(m: ModelShape, pp: int, virtual_stages: int = 1,
                        stage_layers: Sequence[int] = (), v_shape: bool = False) -> list[int]:
    """MoE layers each pipeline rank holds: the model's first ``dense_layers`` layers are
    dense (DeepSeek-style), chunk c of :func:`chunk_layers` lives on rank
    :func:`chunk_rank` (c mod pp)."""
    out = [0] * pp
    start = 0
    for c, n in enumerate(chunk_layers(m.layers, pp, virtual_stages, stage_layers)):
        out[chunk_rank(c, pp, v_shape)] += n - max(0, min(n, m.dense_layers - start))
        start += n
    return out


def stage_expert_params(m: ModelShape, pp: int, virtual_stages: int = 1, ep: int = 1,
                        etp: int = 1, stage_layers: Sequence[int] = (),
                        v_shape: bool = False) -> list[int]:
    """Routed-expert parameters on one rank of each pipeline rank (what ZeRO shards over
    expert_dp = dp/ep rather than dp); all zeros for a dense model."""
    per_layer = expert_layer_params(m, ep, etp)
    return [n * per_layer
            for n in moe_layers_per_rank(m, pp, virtual_stages, stage_layers, v_shape)]


def layer_replicated_params(m: ModelShape) -> int:
    """Parameters of one dense layer that every tensor-parallel rank holds in full: the two
    norms and the row-parallel biases (attention output, MLP down). Under sequence
    parallelism each rank sees only part of the sequence, so their gradients are partial
    and need an all-reduce over the tensor-parallel group (Korthikanti et al. 2022)."""
    return (2 * norm_params(m) + (2 * m.d_model if m.biases else 0)
            + duplicated_attention_params(m))


def vocab_rows(m: ModelShape, tp: int, vocab_parallel: bool = True) -> int:
    """Rows of the embedding (and of an untied head) on one tensor-parallel rank: the
    vocabulary split over tp, the last shard padded up (torch's ``Shard(0)`` of ``chunk``),
    or all of it where the vocabulary stays whole (``vocab_parallel=False``)."""
    return -(-m.vocab // tp) if vocab_parallel else m.vocab


def stage_params(m: ModelShape, tp: int, pp: int, virtual_stages: int = 1,
                 vocab_parallel: bool = True, ep: int = 1, etp: int | None = None,
                 stage_layers: Sequence[int] = (), v_shape: bool = False) -> list[int]:
    """Parameters on one tensor-parallel rank of each pipeline rank (what ZeRO then shards).

    ``vocab_parallel=False`` keeps the embedding and head whole on every tensor-parallel
    rank (as shardlab's simulator does) instead of splitting the vocabulary. ``ep`` and
    ``etp`` (default tp) split the routed experts (module docstring). ``stage_layers``
    gives each chunk's layers (uneven stages; :func:`chunk_layers`), ``v_shape`` places
    the chunks in a V (:func:`chunk_rank`).
    """
    vocab_shard = vocab_rows(m, tp, vocab_parallel) * m.d_model
    out = []
    # Dense layers come first (DeepSeek-style MoE keeps its dense layers at the bottom).
    # Every dense layer is alike, and every MoE layer: count them per chunk, one product
    # each, so the cost grows with the chunks and not with the layers.
    dense_params = layer_params_per_tp_rank(m, tp, False)
    layers = rank_layers(m.layers, pp, virtual_stages, stage_layers, v_shape)
    if not m.moe_layers:
        per_rank = [n * dense_params for n in layers]
    else:
        moe_params = layer_params_per_tp_rank(m, tp, True, ep, etp)
        per_rank = [(n - k) * dense_params + k * moe_params
                    for n, k in zip(layers, moe_layers_per_rank(m, pp, virtual_stages,
                                                                stage_layers, v_shape),
                                    strict=True)]
    # The head sits with the last chunk: on the last rank, or back on rank 0 in a V.
    head = chunk_rank(pp * virtual_stages - 1, pp, v_shape)
    for r in range(pp):
        n = per_rank[r]
        if r == 0:
            n += vocab_shard + (m.context * m.d_model if m.style == "gpt" else 0)
        if r == head:
            n += norm_params(m)
            if not m.tied or head != 0:
                n += vocab_shard
            if m.mtp_layers:
                # Multi-token prediction sits with the head: each depth's projection
                # (column-parallel) and norms, and the embedding it looks the next token up
                # in (a copy on the last rank, as a tied head keeps one).
                n += m.mtp_layers * _split(mtp_params(m), 3 * norm_params(m), tp)
                # (a tied head on that rank is the embedding already)
                n += vocab_shard if head != 0 and not m.tied else 0
        out.append(n)
    return out


def layout_stage_params(m: ModelShape, lay: Layout, vocab_parallel: bool = True) -> list[int]:
    """:func:`stage_params` of a Layout: its tp, pp, chunks, experts and uneven stages."""
    return stage_params(m, lay.tp, lay.pp, lay.virtual_stages, vocab_parallel, lay.ep,
                        lay.etp, lay.stage_layers, lay.schedule in V_SCHEDULES)


def layout_params_split(m: ModelShape, lay: Layout, vocab_parallel: bool = True
                        ) -> list[tuple[int, int]]:
    """(dense, routed-expert) parameters on one rank of each pipeline rank of a Layout:
    :func:`layout_stage_params` and :func:`stage_expert_params` (ZeRO shards the first
    over dp, the second over expert_dp)."""
    v_shape = lay.schedule in V_SCHEDULES
    total = layout_stage_params(m, lay, vocab_parallel)
    experts = stage_expert_params(m, lay.pp, lay.virtual_stages, lay.ep, lay.etp,
                                  lay.stage_layers, v_shape)
    return [(t - x, x) for t, x in zip(total, experts, strict=True)]
