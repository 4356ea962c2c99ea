"""The search space: every valid layout passes make_layout, every rejected one fails it."""

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.layout import RECOMPUTE, SCHEDULES, make_layout
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.plan.space import (
    R_DUALPIPE,
    R_MEMORY,
    R_TRAIN,
    REASONS,
    TRAIN_SCHEDULES,
    Space,
    enumerate_space,
)
from shardlab.schedules.generators import build


def _make(model: ModelShape, sp: Space, lay: dict) -> object:
    return make_layout(model, gpus=sp.gpus, dp=lay["dp"], tp=lay["tp"], pp=lay["pp"],
                       virtual_stages=lay["virtual_stages"], zero=lay["zero"], sp=lay["sp"],
                       micro_batch=lay["micro_batch"], global_batch=sp.global_batch,
                       seq=sp.seq, recompute=lay["recompute"], schedule=lay["schedule"])


@pytest.mark.parametrize(("name", "gpus", "batch", "seq"), [
    ("llama-3-8b", 64, 64, 2048), ("gpt2", 12, 24, 1000), ("mixtral-8x7b", 32, 32, 4096)])
def test_valid_layouts_pass_make_layout_and_rejected_ones_fail(name: str, gpus: int,
                                                               batch: int, seq: int) -> None:
    model = get_model(name)
    sp = Space(gpus=gpus, global_batch=batch, seq=seq)
    c = enumerate_space(model, sp)
    rng = np.random.default_rng(0)
    valid = np.flatnonzero(c.reason < 0)
    bad = np.flatnonzero(c.reason >= 0)
    assert len(valid) and len(bad)
    for i in rng.choice(valid, min(150, len(valid)), replace=False):
        lay = c.layout(int(i))
        made = _make(model, sp, lay)
        assert made.microbatches == lay["microbatches"]
    for i in rng.choice(bad, min(150, len(bad)), replace=False):
        lay = c.layout(int(i))
        with pytest.raises(SpecError):
            if REASONS[c.reason[i]] == R_DUALPIPE:
                # The schedule generator's rule, not make_layout's.
                build("dualpipev", lay["pp"], lay["microbatches"], 2)
            _make(model, sp, lay)


def test_space_lists_each_layout_once_and_covers_the_factorizations() -> None:
    model = get_model("llama-3-8b")
    c = enumerate_space(model, Space(gpus=16, global_batch=32, seq=1024))
    keys = {tuple(c.layout(i).values()) for i in range(len(c))}
    assert len(keys) == len(c)
    assert set(zip(c.dp.tolist(), c.tp.tolist(), c.pp.tolist(), strict=True)) == {
        (16 // (t * p), t, p) for t in (1, 2, 4, 8, 16) for p in (1, 2, 4, 8, 16)
        if t <= 8 and 16 % (t * p) == 0}
    # ZeRO stages only with dp > 1, sequence parallel only with tp > 1.
    assert not ((c.dp == 1) & (c.zero > 0)).any()
    assert not ((c.tp == 1) & c.sp).any()
    assert (c.reason != REASONS.index(R_MEMORY)).all()  # memory is the search's to judge


def test_train_only_keeps_what_shardlab_train_runs() -> None:
    model = ModelShape("tied", 4, 64, 4, vocab=256, context=64, style="gpt", tied=True)
    c = enumerate_space(model, Space(gpus=4, global_batch=8, seq=32, train_only=True))
    assert set(c.zero.tolist()) <= {0, 2, 3}
    assert {SCHEDULES[s] for s in c.schedule.tolist()} <= set(TRAIN_SCHEDULES)
    refused = c.reason == REASONS.index(R_TRAIN)
    # A tied head split over pipeline stages with tp > 1, or DDP with tp > 1: refused.
    # (a layout counts under the first rule it breaks, so some show an earlier reason)
    assert (c.reason[(c.tp > 1) & (c.pp > 1)] >= 0).all()
    assert (c.reason[(c.tp > 1) & (c.dp > 1) & (c.zero == 0)] >= 0).all()
    assert refused.any()
    assert not refused[(c.tp == 1)].any()
    assert {RECOMPUTE[r] for r in c.recompute.tolist()} == set(RECOMPUTE)


def test_bad_space_values_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="zero"):
        Space(gpus=8, global_batch=8, seq=8, zero=(4,))
    with pytest.raises(SpecError, match="schedule"):
        Space(gpus=8, global_batch=8, seq=8, schedules=("zigzag",))
