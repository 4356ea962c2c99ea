"""The search space: every valid layout passes make_layout, every rejected one fails it."""

import itertools

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.layout import RECOMPUTE, SCHEDULES, make_layout
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.plan.choices import divisors, expert_choices, split_choices
from shardlab.plan.rules import R_DUALPIPE, R_MEMORY, R_TRAIN, REASONS
from shardlab.plan.space import TRAIN_SCHEDULES, Space, _meshes, enumerate_space, unique_rows
from shardlab.schedules.generators import build


def _make(model: ModelShape, sp: Space, lay: dict) -> object:
    return make_layout(model, gpus=sp.gpus, dp=lay["dp"], tp=lay["tp"], pp=lay["pp"],
                       virtual_stages=lay["virtual_stages"], zero=lay["zero"], sp=lay["sp"],
                       micro_batch=lay["micro_batch"], global_batch=sp.global_batch,
                       seq=sp.seq, recompute=lay["recompute"], schedule=lay["schedule"],
                       ep=lay["ep"], etp=lay["etp"], capacity_factor=lay["capacity_factor"],
                       cp=lay["cp"], stage_layers=lay["stage_layers"],
                       dp_replicate=lay["dp_replicate"])


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
    # A tied head split over pipeline stages with tp > 1, DDP with tp > 1 or in a pipeline,
    # 1F1B with fewer micro-batches than stages: refused (a layout counts under the first
    # rule it breaks, so some show an earlier reason).
    ddp_pp = (c.pp > 1) & (c.dp > 1) & (c.zero == 0)
    short = (c.pp > 1) & (c.schedule == SCHEDULES.index("1f1b")) & (c.microbatches < c.pp)
    assert (c.reason[(c.tp > 1) & (c.pp > 1)] >= 0).all()
    assert (c.reason[(c.tp > 1) & (c.dp > 1) & (c.zero == 0)] >= 0).all()
    assert (c.reason[ddp_pp | short] >= 0).all() and refused[ddp_pp | short].any()
    assert not refused[(c.tp == 1) & ~ddp_pp & ~short].any()
    assert {RECOMPUTE[r] for r in c.recompute.tolist()} == set(RECOMPUTE)


def test_bad_space_values_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="zero"):
        Space(gpus=8, global_batch=8, seq=8, zero=(4,))
    with pytest.raises(SpecError, match="schedule"):
        Space(gpus=8, global_batch=8, seq=8, schedules=("zigzag",))


@pytest.mark.parametrize(("name", "gpus"), [("gpt2", 24), ("mixtral-8x7b", 16)])
def test_layouts_come_in_the_product_order_of_each_mesh(name: str, gpus: int) -> None:
    # Ties in step time keep this order, so the numpy enumeration must keep itertools'.
    model = get_model(name)
    sp = Space(gpus=gpus, global_batch=48, seq=1024, zero=(0, 2, 3), micro_batches=(1, 3))
    c = enumerate_space(model, sp)
    rows = [(dp, cp, tp, pp, v, sched, rep, c.splits.index(split), e, et, z, s,
             RECOMPUTE.index(r), mb)
            for dp, cp, tp, pp, sched, vs, ex, rep in _meshes(model, sp) for v in vs
            for split in split_choices(model.layers, pp, v, ks=sp.fewer_at_ends)
            for e, et in ex
            for z, s, r, mb in itertools.product(
                tuple(z for z in sp.zero if z) if rep > 1 else sp.zero if dp * cp > 1 else (0,),
                sp.sp if tp > 1 else (False,), sp.recompute, sp.micro_batches)]
    got = np.stack([c.dp, c.cp, c.tp, c.pp, c.virtual, c.schedule, c.dp_replicate, c.split,
                    c.ep, c.etp, c.zero, c.sp, c.recompute, c.micro_batch], axis=1)
    assert got.tolist() == [list(map(int, r)) for r in rows]


def test_moe_meshes_search_ep_over_divisors_of_dp_and_experts_and_etp_over_1_and_tp() -> None:
    mixtral = get_model("mixtral-8x7b")
    assert expert_choices(mixtral, 16, 2) == [(1, 2), (2, 2), (4, 2), (8, 2), (1, 1), (2, 1),
                                              (4, 1), (8, 1)]
    assert expert_choices(mixtral, 12, 1) == [(1, 1), (2, 1), (4, 1)]
    assert expert_choices(mixtral, 16, 1, eps=(8, 3)) == [(8, 1)]
    assert expert_choices(get_model("gpt2"), 16, 4) == [(1, 4)]
    c = enumerate_space(mixtral, Space(gpus=16, global_batch=32, seq=1024, ep=(8,)))
    assert set(c.ep.tolist()) == {8} and set(c.dp.tolist()) == {8, 16}
    with pytest.raises(SpecError, match="ep"):
        enumerate_space(mixtral, Space(gpus=4, global_batch=8, seq=1024, ep=(8,)))
    moe_train = enumerate_space(mixtral, Space(gpus=4, global_batch=8, seq=64,
                                               train_only=True))
    # shardlab train builds whole experts: etp = tp > 1 is refused (under its first rule).
    assert (moe_train.reason[moe_train.etp > 1] >= 0).all()
    assert (moe_train.reason[moe_train.etp > 1] == REASONS.index(R_TRAIN)).any()
    assert ((moe_train.reason < 0) & (moe_train.tp > 1)).any()


def test_divisors_and_unique_rows() -> None:
    for n in range(1, 1500):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert divisors(2**20) == [2**k for k in range(21)] and len(divisors(720720)) == 240
    a, b = np.array([3, 1, 3, 1, 2]), np.array([0, 5, 0, 4, 7])
    uniq, inv = unique_rows(a, b)
    want, want_inv = np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)
    assert uniq.tolist() == want.tolist() and inv.tolist() == want_inv.ravel().tolist()


@pytest.mark.parametrize(("kw", "field"), [
    ({"gpus": 10**9}, "gpus"), ({"global_batch": 2**25}, "global_batch"),
    ({"seq": 2**25}, "seq"), ({"max_virtual": 5000}, "max_virtual"),
    ({"max_tp": 2**21}, "max_tp"), ({"micro_batches": (1, 2**25)}, "micro_batch"),
])
def test_space_counts_are_bounded(kw: dict, field: str) -> None:
    with pytest.raises(SpecError) as e:
        Space(**{"gpus": 8, "global_batch": 8, "seq": 8, **kw})
    assert e.value.field == field and "must be <=" in str(e.value)


def test_a_search_over_the_limit_is_refused_before_it_is_built() -> None:
    # 2.5 billion layouts: counted, not built (building them once ran out of memory).
    model = ModelShape("deep", 4096, 64, 4, vocab=256, context=64, style="llama")
    sp = Space(gpus=720720, global_batch=720720, seq=32, max_tp=720720, max_virtual=4096)
    with pytest.raises(SpecError, match="a search evaluates at most 2,000,000") as e:
        enumerate_space(model, sp)
    assert e.value.field == "layouts" and e.value.value > 2_000_000
