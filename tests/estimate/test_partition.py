"""Placement of layers and parameters on pipeline stages and tensor-parallel ranks."""

import pytest

from shardlab.config.catalog import MODELS, get_model
from shardlab.config.model import ModelShape, MoE
from shardlab.estimate import partition
from shardlab.estimate.params import count_params
from shardlab.estimate.partition import (
    chunk_layers,
    layer_params_per_tp_rank,
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
