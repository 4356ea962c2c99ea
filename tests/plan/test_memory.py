"""The vectorised memory equals the estimate's stage_memory, layout by layout."""

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.layout import SCHEDULES, make_layout
from shardlab.estimate.memory import inflight_microbatches, peak_stage, stage_memory
from shardlab.plan.memory import MemoryOptions, inflight, memory_arrays
from shardlab.plan.space import Space, enumerate_space


@pytest.mark.parametrize(("name", "gpus", "batch", "seq", "dropout", "flash"), [
    ("llama-3-70b", 64, 128, 4096, False, True),
    ("gpt3-175b", 64, 64, 2048, True, False),
    ("mixtral-8x7b", 16, 32, 4096, False, True),
])
def test_memory_arrays_equal_stage_memory(name: str, gpus: int, batch: int, seq: int,
                                          dropout: bool, flash: bool) -> None:
    model = get_model(name)
    sp = Space(gpus=gpus, global_batch=batch, seq=seq)
    c = enumerate_space(model, sp)
    v = c.take(c.reason < 0)
    policy = get_policy("bf16")
    mem = memory_arrays(model, v, seq, policy, MemoryOptions(dropout=dropout, flash=flash))
    rng = np.random.default_rng(1)
    for i in rng.choice(len(v), min(120, len(v)), replace=False).tolist():
        lay = v.layout(i)
        layout = make_layout(model, gpus=gpus, dp=lay["dp"], tp=lay["tp"], pp=lay["pp"],
                             virtual_stages=lay["virtual_stages"], zero=lay["zero"],
                             sp=lay["sp"], micro_batch=lay["micro_batch"], global_batch=batch,
                             seq=seq, recompute=lay["recompute"], schedule=lay["schedule"])
        peak = peak_stage(stage_memory(model, layout, dropout, flash))
        assert mem.total[i] == pytest.approx(peak.total, rel=1e-9)
        assert mem.activations[i] == pytest.approx(peak.activations, rel=1e-9)
        assert mem.optimizer[i] == pytest.approx(peak.states.optimizer, rel=1e-9)
        assert mem.params[i] == peak.params


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
