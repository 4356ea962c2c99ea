"""The planner with context parallelism, HSDP and uneven pipeline stages: the search lists
them, their memory is the budget's, their step-time parts are the cost model's bytes on
the right link, and the busiest stage sets the pace."""

from dataclasses import replace

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator, with_nics
from shardlab.config.layout import SCHEDULES, Layout, make_layout
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.estimate.budget import model_budget
from shardlab.estimate.memory import peak_stage, stage_memory
from shardlab.plan import space
from shardlab.plan.choices import fewer_at_ends, fewer_at_ends_ks
from shardlab.plan.memory import MemoryOptions, memory_arrays
from shardlab.plan.options import step_options_for
from shardlab.plan.rules import R_HSDP, REASONS
from shardlab.plan.search import layout_candidates, plan
from shardlab.plan.space import Space, enumerate_search, enumerate_space
from shardlab.plan.stages import timed_ranks

H100 = get_accelerator("h100")
BF16 = get_policy("bf16")
LLAMA3_8B = get_model("llama-3-8b")


def _layout(model: ModelShape, space: Space, lay: dict) -> Layout:
    return make_layout(model, gpus=space.gpus, dp=lay["dp"], tp=lay["tp"], pp=lay["pp"],
                       virtual_stages=lay["virtual_stages"], zero=lay["zero"], sp=lay["sp"],
                       micro_batch=lay["micro_batch"], global_batch=space.global_batch,
                       seq=space.seq, recompute=lay["recompute"], schedule=lay["schedule"],
                       cp=lay["cp"], stage_layers=lay["stage_layers"],
                       dp_replicate=lay["dp_replicate"])


def test_the_search_lists_cp_hsdp_and_uneven_splits_and_their_memory_is_the_budgets() -> None:
    sp = Space(gpus=32, global_batch=32, seq=16384, micro_batches=(1,),
               recompute=("none", "full"))
    c = enumerate_space(LLAMA3_8B, sp)
    valid = c.reason < 0
    # cp keeps at least 4,096 tokens per rank: 1, 2, 4 at 16,384.
    assert set(c.cp[valid].tolist()) == {1, 2, 4}
    assert (c.dp_replicate > 1).any() and (c.split > 0).any()
    # HSDP shards within a node: dp_shard x cp x tp = 8, and never with ZeRO 0.
    hsdp = valid & (c.dp_replicate > 1)
    assert (c.dp_shard[hsdp] * c.cp[hsdp] * c.tp[hsdp] == 8).all()
    assert not ((c.dp_replicate > 1) & (c.zero == 0)).any()
    v = c.take(valid)
    mem = memory_arrays(LLAMA3_8B, v, sp.seq, BF16, MemoryOptions(dropout=False, flash=True))
    rng = np.random.default_rng(7)
    picks = rng.choice(len(v), 60, replace=False).tolist()
    # ... and some of each kind for sure.
    picks += [int(np.flatnonzero(x)[0]) for x in (v.cp > 1, v.dp_replicate > 1, v.split > 0)]
    for i in picks:
        layout = _layout(LLAMA3_8B, sp, v.layout(i))
        peak = peak_stage(stage_memory(LLAMA3_8B, layout, False, True))
        assert mem.total[i] == pytest.approx(peak.total, rel=1e-9), v.layout(i)
        assert mem.stage[i] == peak.stage


def test_llama3_8b_at_131072_on_64_h100_picks_cp() -> None:
    """``shardlab plan llama-3-8b --gpu h100 --gpus 64 --seq 131072 --global-batch 64``."""
    p = plan(LLAMA3_8B, H100, Space(gpus=64, global_batch=64, seq=131072), BF16, top=5)
    best = p.best[0]
    assert best["cp"] > 1 and best["breakdown"]["cp_comm"] > 0
    assert all(b["dp"] * b["cp"] * b["tp"] * b["pp"] == 64 for b in p.best)
    # Without cp the best layout is slower (tensor parallelism's all-reduces of every
    # token's activations against cp's gathers of the GQA keys and values).
    flat = plan(LLAMA3_8B, H100, Space(gpus=64, global_batch=64, seq=131072, cp=(1,)), BF16)
    assert flat.best[0]["step_seconds"] > best["step_seconds"]


def test_cp_comm_is_the_budgets_bytes_on_the_cp_link() -> None:
    sp = Space(gpus=64, global_batch=8, seq=131072)
    text = "dp=8 cp=8 zero=3 recompute=full"
    best = plan(LLAMA3_8B, H100, sp, BF16, only=layout_candidates(LLAMA3_8B, sp, text)).best[0]
    lay = make_layout(LLAMA3_8B, gpus=64, dp=8, cp=8, zero=3, recompute="full",
                      global_batch=8, seq=131072)
    doc = model_budget(LLAMA3_8B, lay, H100)
    link, eff = H100.intra_link, H100.efficiency
    assert eff is not None
    # 32 layers x (2 gathers + 1 reduce-scatter) per micro-batch, each (cp-1) latencies.
    calls = doc["cp"]["calls_per_step"]
    assert calls == 32 * 3
    want = calls * 7 * link.latency + doc["comm"]["cp_bytes_per_step"] / (
        link.bandwidth * eff.link_fraction)
    assert best["breakdown"]["cp_comm"] == pytest.approx(want, rel=1e-9)
    assert best["memory_per_device"] == pytest.approx(doc["memory"]["per_device"]["total"])


def test_torchtitans_ring_moves_every_query_heads_kv_and_fp32_gradients() -> None:
    # torchtitan repeats K/V to all 32 query heads before attention (4x the 8 kv heads'
    # bytes); torch's ring gathers them forward, again for the recompute and in backward,
    # and passes dK/dV round in fp32 (twice bf16's bytes): 3 gathers + one 2x-byte pass.
    sp = Space(gpus=64, global_batch=8, seq=131072)
    text = "dp=8 cp=8 zero=3 recompute=full"
    only = layout_candidates(LLAMA3_8B, sp, text)
    megatron = plan(LLAMA3_8B, H100, sp, BF16, only=only,
                    options=step_options_for(H100, flash=True, framework="megatron")).best[0]
    titan = plan(LLAMA3_8B, H100, sp, BF16, only=only,
                 options=step_options_for(H100, flash=True, framework="torchtitan")).best[0]
    link, eff = H100.intra_link, H100.efficiency
    assert eff is not None
    kv = 131072 * 2 * 1024 * 2  # bytes of one sequence's K and V, 8 heads of 128, bf16
    gather = 7 * link.latency + 7 / 8 * 4 * kv / (link.bandwidth * eff.link_fraction)
    grads = 7 * link.latency + 7 / 8 * 8 * kv / (link.bandwidth * eff.link_fraction)
    assert titan["breakdown"]["cp_comm"] == pytest.approx(32 * (3 * gather + grads), rel=1e-9)
    assert megatron["breakdown"]["cp_comm"] == pytest.approx(
        32 * 3 * (7 * link.latency + 7 / 8 * kv / (link.bandwidth * eff.link_fraction)),
        rel=1e-9)


def test_hsdp_replicas_all_reduce_across_nodes_and_gather_inside() -> None:
    m = get_model("llama-3-70b")
    sp = Space(gpus=256, global_batch=2048, seq=4096)
    opts = " zero=3 recompute=full micro_batch=1"
    # With 8 micro-batches on a thin network (one 400 Gb/s NIC per node), a flat ring's 16
    # gathers cross it, HSDP's stay on NVLink inside a node and only its replicas' one
    # all-reduce crosses: far less exposed data-parallel time. (Per step both move about
    # as many bytes out of a node with one micro-batch: the flat ring leaves each node
    # over all of its NICs, comm_time.members_per_node.)
    thin = with_nics(H100, 1, 400)
    flat = plan(m, thin, sp, BF16, only=layout_candidates(m, sp, "dp=256" + opts)).best[0]
    hsdp = plan(m, thin, sp, BF16, only=layout_candidates(m, sp, "dp=256 dp_replicate=32"
                                                          + opts)).best[0]
    assert hsdp["breakdown"]["dp_comm"] < flat["breakdown"]["dp_comm"] / 4
    # ... at the memory of states over 8 ranks, not 256.
    assert hsdp["memory_breakdown"]["optimizer"] == pytest.approx(
        32 * flat["memory_breakdown"]["optimizer"])
    with pytest.raises(SpecError, match="dp_replicate"):
        layout_candidates(m, sp, "dp=256 dp_replicate=3 zero=3")
    c = enumerate_space(m, Space(gpus=256, global_batch=256, seq=4096, dp_replicate=(32,)))
    assert set(c.dp_replicate.tolist()) == {32} and not (c.zero == 0).any()
    with pytest.raises(SpecError, match="dp_replicate"):  # make_layout's rule, R_HSDP's too
        layout_candidates(m, sp, "dp=256 dp_replicate=32 zero=0")
    assert R_HSDP in REASONS


def test_uneven_splits_follow_torchtitan_and_the_busiest_rank_sets_the_step() -> None:
    assert fewer_at_ends(126, 16, 1) == (7, *[8] * 14, 7)          # Llama 3 405B
    assert fewer_at_ends(126, 64, 1) == (1, *[2] * 62, 1)
    assert fewer_at_ends(32, 4, 2) == (7, 9, 9, 7)
    assert fewer_at_ends(8, 8, 1) is None and fewer_at_ends(5, 2, 1) == (3, 2)
    # Only splits that differ from the even one are tried (5 over 3 is 2+2+1 either way).
    assert fewer_at_ends_ks(5, 3, (1, 2)) == (2,) and fewer_at_ends_ks(32, 4, (1, 2)) == (1, 2)
    for layers in range(3, 70):
        for chunks in range(2, layers + 1):
            for k in (1, 2, 3):
                split = fewer_at_ends(layers, chunks, k)
                even = tuple([layers // chunks + 1] * (layers % chunks)
                             + [layers // chunks] * (chunks - layers % chunks))
                differs = split is not None and split != even
                assert (k in fewer_at_ends_ks(layers, chunks, (k,))) == differs
    # The head makes the last of 4 even stages the busiest; one layer moved off each end
    # makes a middle stage the busiest and the step shorter.
    sp = Space(gpus=32, global_batch=64, seq=8192)
    text = "dp=8 pp=4 zero=1 schedule=1f1b"
    even = plan(LLAMA3_8B, H100, sp, BF16, only=layout_candidates(LLAMA3_8B, sp, text)).best[0]
    moved = plan(LLAMA3_8B, H100, sp, BF16,
                 only=layout_candidates(LLAMA3_8B, sp, text + " stage_layers=8+9+8+7")).best[0]
    assert even["timed_stage"] == 3 and moved["timed_stage"] == 1
    assert moved["step_seconds"] < even["step_seconds"]
    layers, emb, head, rank = timed_ranks(32, np.array([4]), np.array([1]), np.array([1]),
                                          ((), (8, 9, 8, 7)), np.array([SCHEDULES.index("1f1b")]))
    assert set(zip(rank[0].tolist(), layers[0].tolist(), strict=True)) == {(0, 8), (1, 9), (3, 7)}
    assert emb[0][rank[0] == 0].all() and head[0][rank[0] == 3].all()


def test_uneven_splits_give_way_when_they_alone_pass_the_layout_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sp = Space(gpus=32, global_batch=64, seq=8192)
    even = len(enumerate_space(LLAMA3_8B, replace(sp, fewer_at_ends=())))
    assert len(enumerate_space(LLAMA3_8B, sp)) > even
    monkeypatch.setattr(space, "MAX_CANDIDATES", even)
    c, note = enumerate_search(LLAMA3_8B, sp)
    assert len(c) == even and not (c.split > 0).any()
    assert note is not None and "uneven pipeline splits not searched" in note
    monkeypatch.setattr(space, "MAX_CANDIDATES", even - 1)
    with pytest.raises(SpecError, match="a search evaluates at most"):
        enumerate_search(LLAMA3_8B, sp)
