"""Group-limited routing (DeepSeek-V3's node-limited routing, Megatron-Core's
``--moe-router-num-groups/--moe-router-group-topk``) under forced balance: how many ranks
and nodes a token's experts reach, sampled as Megatron-Core's router draws them."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.plan.expert_time import (
    alltoall_seconds,
    ep_members_per_node,
    grouped_choice,
    grouped_spread,
    ranks_per_token,
)
from shardlab.plan.search import device_of, layout_candidates
from shardlab.plan.space import Space


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


@pytest.mark.parametrize("bins", [2, 4, 8])
def test_the_sampled_spread_is_the_routing_written_plainly(bins: int) -> None:
    # 16 experts in 4 groups, top 4 from the best 2: within sampling error (3 standard
    # errors of 4,000 tokens by hand, about 0.05).
    assert grouped_spread(16, 4, 4, 2, bins) == pytest.approx(
        _by_hand(16, 4, 4, 2, bins, 4000), abs=0.05)
    assert grouped_spread(16, 4, 4, 2, bins) < bins * (1 - math.comb(16 - 16 // bins, 4)
                                                        / math.comb(16, 4))  # uniform


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


def test_the_limit_cheapens_a_token_dispatch_not_nccl_s_all_to_all() -> None:
    ds = get_model("deepseek-v3")
    assert ds.moe is not None
    free = replace(ds, moe=replace(ds.moe, groups=1, group_topk=1))
    space = Space(gpus=64, global_batch=64, seq=4096)
    c = layout_candidates(ds, space, "dp=64 ep=64")
    dev = device_of(get_accelerator("H100 SXM"), get_policy("bf16"), 64)[0]
    nvl, net = (dev.link("all_to_all", np.full(1, x)) for x in (True, False))
    nodes = ep_members_per_node(c, c.cp, 8)

    def a2a(m: object, dispatcher: str) -> float:
        return float(alltoall_seconds(m, c, 4096, get_policy("bf16"), *nvl, dispatcher,
                                      "random", net, nodes)[0])

    assert a2a(ds, "alltoall") == a2a(free, "alltoall")  # T·k rows whatever the groups
    assert a2a(ds, "flex") < 0.8 * a2a(free, "flex")  # 3.97 of 8 nodes, not 5.30


def test_grouped_choice_is_read_only_and_bins_need_not_divide() -> None:
    chosen = grouped_choice(256, 8, 8, 4)
    with pytest.raises(ValueError):
        chosen[0, 0] = 1
    assert 1.0 < grouped_spread(256, 8, 8, 4, 3) <= 3.0
    assert grouped_spread(256, 8, 8, 4, 1000) == grouped_spread(256, 8, 8, 4, 256) == 8.0
