"""The vectorised memory equals the estimate's stage_memory, layout by layout."""

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.layout import SCHEDULES, make_layout
from shardlab.config.model import ModelShape, MoE
from shardlab.estimate.expert import rank_params_split
from shardlab.estimate.memory import inflight_microbatches, peak_stage, stage_memory
from shardlab.plan import memory
from shardlab.plan.memory import MemoryOptions, inflight, memory_arrays
from shardlab.plan.space import Space, enumerate_space


@pytest.mark.parametrize(("name", "gpus", "batch", "seq", "dropout", "flash", "cf", "imbalance",
                          "dtype", "fold"), [
    ("llama-3-70b", 64, 128, 4096, False, True, 0.0, 1.0, "bf16", False),
    ("gpt3-175b", 64, 64, 2048, True, False, 0.0, 1.0, "bf16", False),
    ("mixtral-8x7b", 16, 32, 4096, False, True, 0.0, 1.0, "bf16", False),
    ("mixtral-8x7b", 32, 64, 1024, False, True, 1.25, 1.7, "bf16", False),
    # fp8: the linear weights' fp8 copies and scales, ZeRO 0-2 only.
    ("llama-3-70b", 64, 128, 4096, False, True, 0.0, 1.0, "fp8", False),
    ("mixtral-8x7b", 16, 32, 4096, False, True, 0.0, 1.0, "fp8", False),
    # The expert mesh folded over tp x cp x dp (Megatron-Core, torchtitan): ep up to 8 > dp.
    ("mixtral-8x7b", 16, 32, 4096, False, True, 0.0, 1.0, "bf16", True),
    ("mixtral-8x7b", 32, 64, 1024, False, True, 1.25, 1.7, "fp8", True),
])
def test_memory_arrays_equal_stage_memory(name: str, gpus: int, batch: int, seq: int,
                                          dropout: bool, flash: bool, cf: float,
                                          imbalance: float, dtype: str, fold: bool) -> None:
    model = get_model(name)
    sp = Space(gpus=gpus, global_batch=batch, seq=seq, capacity_factor=cf, expert_fold=fold)
    c = enumerate_space(model, sp)
    v = c.take(c.reason < 0)
    policy = get_policy(dtype)
    mem = memory_arrays(model, v, seq, policy, MemoryOptions(dropout=dropout, flash=flash,
                                                             imbalance=imbalance))
    rng = np.random.default_rng(1)
    for i in rng.choice(len(v), min(120, len(v)), replace=False).tolist():
        lay = v.layout(i)
        layout = make_layout(model, gpus=gpus, dp=lay["dp"], tp=lay["tp"], pp=lay["pp"],
                             virtual_stages=lay["virtual_stages"], zero=lay["zero"],
                             sp=lay["sp"], micro_batch=lay["micro_batch"], global_batch=batch,
                             seq=seq, recompute=lay["recompute"], schedule=lay["schedule"],
                             ep=lay["ep"], etp=lay["etp"], capacity_factor=cf, dtype=dtype,
                             cp=lay["cp"], stage_layers=lay["stage_layers"],
                             dp_replicate=lay["dp_replicate"], expert_fold=fold)
        peak = peak_stage(stage_memory(model, layout, dropout, flash, imbalance))
        assert mem.total[i] == pytest.approx(peak.total, rel=1e-9)
        assert mem.weights[i] == pytest.approx(peak.states.weights, rel=1e-9)
        assert mem.activations[i] == pytest.approx(peak.activations, rel=1e-9)
        assert mem.optimizer[i] == pytest.approx(peak.states.optimizer, rel=1e-9)
        assert mem.params[i] == peak.params
        if model.moe is not None:
            assert mem.expert_params[i] == rank_params_split(model, layout)[peak.stage][1]
    if fold:  # the folded space holds layouts the unfolded one cannot express
        assert np.any(v.ep > v.dp)


def test_inflight_equals_the_estimate_for_every_schedule() -> None:
    for s in SCHEDULES:
        for p in (2, 3, 4, 8):
            for m in (1, 3, 8, 16):
                v = 2 if s in ("interleaved-1f1b", "zb-v", "dualpipev") else 1
                ranks = np.arange(p)
                got = inflight(np.array(SCHEDULES.index(s)), np.array(p), ranks, np.array(m),
                               np.array(v))
                want = [inflight_microbatches(s, p, r, m, v) for r in range(p)]
                assert got.tolist() == pytest.approx(want)


@pytest.mark.parametrize("name", ["llama-3-70b", "gpt3-175b", "mixtral-8x7b"])
def test_ranks_0_1_and_last_find_the_busiest_when_layers_are_alike(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = get_model(name)
    sp = Space(gpus=32, global_batch=64, seq=2048, micro_batches=(1, 2))
    c = enumerate_space(model, sp)
    v = c.take(c.reason < 0)
    opt = MemoryOptions(dropout=True, flash=False)
    every = memory_arrays(model, v, 2048, get_policy("bf16"), opt, all_ranks=True)
    three = memory_arrays(model, v, 2048, get_policy("bf16"), opt)
    # In blocks of a few layouts, too (a deep search once built one table of them all).
    monkeypatch.setattr(memory, "BLOCK_ELEMENTS", 997)
    blocks = memory_arrays(model, v, 2048, get_policy("bf16"), opt, all_ranks=True)
    for got in (three, blocks):
        for k in ("weights", "gradients", "optimizer", "activations", "params", "stage"):
            assert np.array_equal(getattr(got, k), getattr(every, k)), k


def test_mixed_dense_and_moe_layers_compare_every_rank() -> None:
    model = ModelShape("mixed", 12, 256, 4, vocab=1000, context=512, style="llama",
                       moe=MoE(experts=64, experts_per_token=2, expert_d_ff=512,
                               dense_layers=5))
    sp = Space(gpus=12, global_batch=24, seq=512)
    c = enumerate_space(model, sp)
    v = c.take(c.reason < 0)
    mem = memory_arrays(model, v, 512, get_policy("bf16"), MemoryOptions(False, True))
    every = memory_arrays(model, v, 512, get_policy("bf16"), MemoryOptions(False, True),
                          all_ranks=True)
    assert np.array_equal(mem.total, every.total) and np.array_equal(mem.stage, every.stage)
    # Here the busiest rank can be a middle one past rank 1 (the MoE layers are heavier).
    assert ((mem.stage > 1) & (mem.stage < v.pp - 1)).any()
