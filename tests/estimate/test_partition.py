"""Placement of layers and parameters on pipeline stages and tensor-parallel ranks."""

import pytest

from shardlab.config.catalog import MODELS, get_model
from shardlab.config.layout import make_layout
from shardlab.config.model import ModelShape, MoE
from shardlab.estimate import partition
from shardlab.estimate.params import count_params
from shardlab.estimate.partition import (
    chunk_layers,
    layer_params_per_tp_rank,
    layout_params_split,
    layout_stage_params,
    rank_layers,
    stage_params,
)


def test_chunks_and_ranks() -> None:
    assert chunk_layers(10, 4) == [3, 3, 2, 2]
    assert rank_layers(10, 2, 2) == [5, 5]  # chunks [3,3,2,2]: rank 0 has chunks 0 and 2
    assert rank_layers(32, 4, 2) == [8, 8, 8, 8]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("pp", [1, 2, 4])
def test_stages_sum_to_total_without_tp(name: str, pp: int) -> None:
    m = MODELS[name]
    extra = m.vocab * m.d_model if (m.tied and pp > 1) else 0  # the last stage's tied copy
    assert sum(stage_params(m, 1, pp)) == count_params(m).total + extra


def test_tp_splits_matrices_and_replicates_norms_and_row_biases() -> None:
    m = get_model("gpt2")
    d, f = 768, 3072
    one = layer_params_per_tp_rank(m, 1, False)
    four = layer_params_per_tp_rank(m, 4, False)
    replicated = 2 * 2 * d + d + d  # two LayerNorms, attention-out and MLP-down biases
    assert four == (one - replicated) // 4 + replicated
    assert one == 12 * d * d + 13 * d and f == 4 * d


def test_moe_router_is_replicated() -> None:
    m = get_model("mixtral-8x7b")
    one = layer_params_per_tp_rank(m, 1, True)
    two = layer_params_per_tp_rank(m, 2, True)
    router, norms = 4096 * 8, 2 * 4096
    assert two == (one - router - norms) // 2 + router + norms


def test_stage_params_costs_the_chunks_not_the_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    # One call per layer once made a 1,000,000-layer plan run for minutes.
    calls = []
    real = partition.layer_params_per_tp_rank

    def counted(m: ModelShape, tp: int, moe_layer: bool) -> int:
        calls.append(moe_layer)
        return real(m, tp, moe_layer)

    monkeypatch.setattr(partition, "layer_params_per_tp_rank", counted)
    deep = ModelShape("deep", 4096, 64, 4, vocab=100, context=32, style="llama", tied=False)
    assert sum(stage_params(deep, 1, 2)) == count_params(deep).total
    assert len(calls) <= 2


@pytest.mark.parametrize(("pp", "v"), [(1, 1), (2, 1), (3, 2), (4, 3), (12, 1)])
def test_mixed_dense_and_moe_stages_equal_the_layer_by_layer_sum(pp: int, v: int) -> None:
    m = ModelShape("mixed", 12, 256, 4, vocab=1000, context=512, style="llama", tied=False,
                   moe=MoE(experts=8, experts_per_token=2, expert_d_ff=512, dense_layers=5))
    sizes = chunk_layers(12, pp, v)
    want = [0] * pp
    layer = 0
    for c, n in enumerate(sizes):
        for _ in range(n):
            want[c % pp] += layer_params_per_tp_rank(m, 2, moe_layer=layer >= 5)
            layer += 1
    want[0] += 500 * 256  # the embedding's vocabulary shard (tp = 2)
    want[-1] += 256 + 500 * 256  # the final RMSNorm and the untied head's shard
    assert stage_params(m, 2, pp, v) == want
    assert rank_layers(12, pp, v) == [sum(sizes[r::pp]) for r in range(pp)]


def test_stage_layers_place_uneven_chunks_in_a_loop_or_a_v() -> None:
    assert chunk_layers(4, 2, 1, (3, 1)) == [3, 1]
    assert rank_layers(4, 2, 1, (3, 1)) == [3, 1]
    assert rank_layers(12, 2, 2, (1, 4, 4, 3)) == [5, 7]  # chunks 0, 2 on rank 0
    assert rank_layers(12, 2, 2, (1, 4, 4, 3), v_shape=True) == [4, 8]  # chunks 0, 3
    assert rank_layers(10, 2, 2, v_shape=True) == [5, 5]  # even chunks [3, 3, 2, 2] in a V
    with pytest.raises(ValueError, match="summing to 4"):
        chunk_layers(4, 2, 1, (3, 2))


def test_llama_405b_layout_first_and_last_stage_one_layer_fewer() -> None:
    # Llama 3 (Dubey et al. 2024, Sec. 3.3.2): 126 layers on 16 stages, the first and the
    # last one layer fewer than the others so the embedding and the head balance them.
    m = get_model("llama-3.1-405b")
    layers = (7, *[8] * 14, 7)
    lay = make_layout(m, gpus=16 * 8, tp=8, pp=16, stage_layers=layers)
    per_layer = layer_params_per_tp_rank(m, 8, False)
    vocab = -(-m.vocab // 8) * m.d_model
    got = layout_stage_params(m, lay)
    assert got[0] == 7 * per_layer + vocab
    assert got[1:15] == [8 * per_layer] * 14
    assert got[15] == 7 * per_layer + vocab + m.d_model  # head and final RMSNorm
    assert sum(stage_params(m, 1, 16, stage_layers=layers)) == count_params(m).total
    assert layout_params_split(m, lay) == [(n, 0) for n in got]


@pytest.mark.parametrize("layers", [(1, 2, 4, 5), (5, 4, 2, 1), (3, 3, 3, 3)])
def test_uneven_mixed_stages_equal_the_layer_by_layer_sum(layers: tuple[int, ...]) -> None:
    m = ModelShape("mixed", 12, 256, 4, vocab=1000, context=512, style="llama", tied=True,
                   moe=MoE(experts=8, experts_per_token=2, expert_d_ff=512, dense_layers=5))
    want = [0] * 2
    layer = 0
    for c, n in enumerate(layers):
        for _ in range(n):
            want[c % 2] += layer_params_per_tp_rank(m, 1, moe_layer=layer >= 5)
            layer += 1
    want[0] += 1000 * 256
    want[1] += 256 + 1000 * 256  # the final norm and the tied head's own copy
    assert stage_params(m, 1, 2, 2, stage_layers=layers) == want
    v_want = stage_params(m, 1, 2, 2, stage_layers=layers, v_shape=True)
    assert sum(v_want) == sum(want) - 1000 * 256  # in a V the head shares rank 0's embedding
