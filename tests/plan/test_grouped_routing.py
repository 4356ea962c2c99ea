"""Group-limited routing (DeepSeek-V3's node-limited routing, Megatron-Core's
``--moe-router-num-groups/--moe-router-group-topk``) under forced balance: how many ranks
and nodes a token's experts reach, sampled as Megatron-Core's router draws them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.plan.expert_time import grouped_choice, grouped_spread, ranks_per_token


def _by_hand(experts: int, k: int, groups: int, top: int, bins: int, n: int) -> float:
    """The same routing token by token, written plainly (an independent check)."""
    rng = np.random.default_rng(1)
    size, spans = experts // groups, []
    for _ in range(n):
        s = 1 / (1 + np.exp(-rng.standard_normal(experts)))
        score = [sum(sorted(s[g * size:(g + 1) * size])[-(k // top):]) for g in range(groups)]
        kept = sorted(range(groups), key=lambda g: score[g])[-top:]
        pool = [e for g in kept for e in range(g * size, (g + 1) * size)]
        chosen = sorted(pool, key=lambda e: s[e])[-k:]
        spans.append(len({e // (experts // bins) for e in chosen}))
    return float(np.mean(spans))


@pytest.mark.parametrize("bins", [2, 4, 16])
def test_the_sampled_spread_is_the_routing_written_plainly(bins: int) -> None:
    # 16 experts in 4 groups, top 4 from the best 2: within sampling error (3 standard
    # errors of 4,000 tokens by hand, about 0.05).
    assert grouped_spread(16, 4, 4, 2, bins) == pytest.approx(
        _by_hand(16, 4, 4, 2, bins, 4000), abs=0.05)


def test_deepseek_v3_reaches_at_most_four_nodes() -> None:
    chosen = grouped_choice(256, 8, 8, 4)
    nodes = chosen // 32  # 8 nodes of 32 experts: a group each
    assert max(len(set(row)) for row in nodes.tolist()) <= 4
    assert 3.8 < grouped_spread(256, 8, 8, 4, 8) <= 4.0
    assert grouped_spread(256, 8, 8, 4, 1) == 1.0 and grouped_spread(256, 8, 8, 4, 256) == 8.0
    # Without the limit a token's 8 experts reach 5.3 of 8 nodes on average.
    ds = get_model("deepseek-v3")
    assert ds.moe is not None
    free = replace(ds, moe=replace(ds.moe, groups=1, group_topk=1))
    assert ranks_per_token(free, np.array([8]))[0] == pytest.approx(5.295, abs=1e-3)
    assert ranks_per_token(ds, np.array([8]))[0] == pytest.approx(grouped_spread(
        256, 8, 8, 4, 8))
