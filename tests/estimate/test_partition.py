"""Placement of layers and parameters on pipeline stages and tensor-parallel ranks."""

import pytest

from shardlab.config.catalog import MODELS, get_model
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
