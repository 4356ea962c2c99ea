"""The simulator against the papers' closed forms, over many (p, m, v), against a plain
reading of its rules, and its validator."""

import random

import numpy as np
import pytest
from torch.testing import assert_close

from shardlab.errors import SpecError
from shardlab.estimate.memory import inflight_microbatches
from shardlab.schedules.actions import Action, Schedule
from shardlab.schedules.closed_forms import (
    bubble_1f1b,
    bubble_interleaved,
    gpipe_makespan,
    zb_h1_idle,
    zb_h2_idle,
    zb_overall_bubble,
)
from shardlab.schedules.generators import KINDS, build
from shardlab.schedules.simulate import Durations, simulate, stage_layer_scale

SIZES = [(p, m) for p in (1, 2, 3, 4, 6, 8) for m in (1, 2, 3, 4, 7, 8, 16, 33)]
TOL = {"rtol": 1e-12, "atol": 1e-12}


@pytest.mark.parametrize(("p", "m"), SIZES)
def test_gpipe_and_1f1b_bubble(p: int, m: int) -> None:
    for kind in ("gpipe", "1f1b"):
        t = simulate(build(kind, p, m))
        assert_close(t.bubble, bubble_1f1b(p, m), **TOL)
        assert_close(t.makespan, 3.0 * (m + p - 1), **TOL)


@pytest.mark.parametrize(("p", "m"), SIZES)
def test_peak_inflight_gpipe_m_and_1f1b_p(p: int, m: int) -> None:
    assert simulate(build("gpipe", p, m)).peak_inflight == (m,) * p
    peaks = simulate(build("1f1b", p, m)).peak_inflight
    assert peaks[0] == min(p, m)
    assert list(peaks) == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("groups", [1, 2, 5])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_and_peak(p: int, groups: int, v: int) -> None:
    m = groups * p
    t = simulate(build("interleaved-1f1b", p, m, v))
    assert_close(t.bubble, bubble_interleaved(p, m, v), **TOL)
    # Megatron's warm-up count + 1 chunk micro-batches, as the estimate uses.
    for r in range(p):
        assert_close(t.peak_inflight[r] / v, inflight_microbatches("interleaved-1f1b", p, r, m, v),
                     **TOL)


ZB_SIZES = [(p, m) for p in (2, 3, 4, 6, 8) for m in (p, 2 * p, 3 * p + 1, 40)]


@pytest.mark.parametrize(("p", "m"), ZB_SIZES)
@pytest.mark.parametrize("d", [Durations(1, 1, 1), Durations(1, 1.25, 0.75), Durations(2, 1.5, 1),
                               Durations(1, 1, 0.5)])
def test_zero_bubble_closed_forms(p: int, m: int, d: Durations) -> None:
    h1 = simulate(build("zb-h1", p, m), d)
    first = h1.events[0]
    idle = (first[-1].end - first[0].start) - sum(e.end - e.start for e in first)
    assert_close(idle, zb_h1_idle(p, d.t_f, d.t_b, d.t_w), **TOL)
    assert max(h1.peak_inflight) == min(p, m)  # the memory of 1F1B's first stage
    h2 = simulate(build("zb-h2", p, m), d)
    assert max(h2.peak_inflight) <= 2 * p - 1
    if m >= 2 * p - 1:
        ev = h2.events[0]
        idle2 = (ev[-1].end - ev[0].start) - sum(e.end - e.start for e in ev)
        assert_close(idle2, zb_h2_idle(p, d.t_f, d.t_b, d.t_w), **TOL)


# The warm-up fills only from 2p - 1 micro-batches on: p = 8 starts at m = 16.
@pytest.mark.parametrize(("p", "m"), [(p, m) for p in (2, 3, 4, 8) for m in (8, 16, 31)
                                      if m >= 2 * p - 1])
def test_zb_h2_parallelogram(p: int, m: int) -> None:
    t = simulate(build("zb-h2", p, m))
    for r, ev in enumerate(t.events):
        assert (ev[0].start, ev[-1].end) == (r, 3 * m + r)  # busy without a gap
    assert t.bubble_per_rank == (0.0,) * p
    assert_close(t.bubble, zb_overall_bubble(p, m), **TOL)
    assert t.peak_inflight == (2 * p - 1,) * p


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("m", [8, 16, 24])
def test_zb_v_zero_bubble_at_1f1b_memory(p: int, m: int) -> None:
    t = simulate(build("zb-v", p, m))
    if m >= 2 * p:
        assert t.bubble_per_rank == (0.0,) * p
    assert max(t.peak_inflight) <= 2 * p  # 2p half-size chunks = p stage micro-batches


@pytest.mark.parametrize(("kind", "p", "m"), [("zb-v", 4, 16), ("dualpipev", 4, 16),
                                              ("zb-h1", 4, 16), ("zb-h2", 4, 16)])
def test_estimate_inflight_matches_simulation(kind: str, p: int, m: int) -> None:
    s = build(kind, p, m)
    t = simulate(s)
    for r in range(p):
        assert_close(t.peak_inflight[r] / s.virtual_stages,
                     inflight_microbatches(kind, p, r, m, s.virtual_stages), **TOL)


def test_latency_and_imbalance_lengthen_the_makespan() -> None:
    s = build("1f1b", 4, 8)
    base = simulate(s).makespan
    assert simulate(s, Durations(p2p=0.5)).makespan > base
    slow_last = simulate(s, Durations(stage_scale=(1, 1, 1, 2))).makespan
    assert slow_last > base


def _one(ranks: list[list[Action]], p: int = 2, m: int = 1) -> Schedule:
    return Schedule("custom", p, m, 1, tuple(range(p)), tuple(tuple(r) for r in ranks))


def test_validator_rejects_deadlock_missing_and_duplicates() -> None:
    f0, f1 = Action("F", 0, 0), Action("F", 1, 0)
    b0, b1 = Action("B", 0, 0), Action("B", 1, 0)
    assert simulate(_one([[f0, b0], [f1, b1]])).makespan == 6
    with pytest.raises(SpecError, match="deadlocks: rank 0"):
        simulate(_one([[b0, f0], [f1, b1]]))
    with pytest.raises(SpecError, match="missing"):
        simulate(_one([[f0], [f1, b1]]))
    with pytest.raises(SpecError, match="twice"):
        simulate(_one([[f0, f0, b0], [f1, b1]]))
    with pytest.raises(SpecError, match="lives on rank 1"):
        simulate(_one([[f0, b0, f1], [b1]]))
    with pytest.raises(SpecError, match="t-f"):
        Durations(t_f=-1)


def test_a_full_backward_with_a_weight_half_too_is_refused() -> None:
    f0, b0, w0 = Action("F", 0, 0), Action("B", 0, 0), Action("W", 0, 0)
    with pytest.raises(SpecError, match=r"stage 0 micro-batch 0.*both B and I or W"):
        simulate(_one([[f0, b0, w0]], p=1))


def test_a_stage_scale_of_the_wrong_length_shows_the_factors() -> None:
    with pytest.raises(SpecError, match=r"stage_scale='1,2': gives 2 factors; must give one per "
                       r"stage \(4: 2 ranks x 2 chunks\)"):
        simulate(build("zb-v", 2, 4), Durations(stage_scale=(1.0, 2.0)))


def test_durations_past_the_largest_float_are_refused() -> None:
    # Each is finite, their sum is not: the timeline would be inf and its bubble NaN.
    with pytest.raises(SpecError, match=r"durations=.*larger unit"):
        simulate(build("1f1b", 2, 2), Durations(t_b=1e308, t_w=1e308))


def test_interleaved_200k_scale_is_linear() -> None:
    # The benchmark prints the ratio; here only that the big case completes and is valid.
    t = simulate(build("interleaved-1f1b", 16, 64, 2))
    assert_close(t.bubble, bubble_interleaved(16, 64, 2), **TOL)


def _plain(s: Schedule, d: Durations) -> list[list[tuple[float, float]]]:
    """(start, end) of every action by the module's rules read plainly: sweep the ranks, each
    running actions in order while their inputs are done, until none can move."""
    base = {"F": d.t_f, "B": d.t_b + d.t_w, "I": d.t_b, "W": d.t_w}
    done: dict[tuple[str, int, int], float] = {}  # ("F" | "G", stage, micro-batch) -> end
    times: list[list[tuple[float, float]]] = [[] for _ in range(s.pp)]
    moved = True
    while moved:
        moved = False
        for r, actions in enumerate(s.ranks):
            for a in actions[len(times[r]):]:
                st, mb = a.stage, a.microbatch
                if a.kind == "F":
                    needs = [(("F", st - 1, mb), s.placement[st - 1] != r)] if st else []
                elif a.kind == "W":
                    needs = [(("G", st, mb), False)]
                else:
                    needs = [(("F", st, mb), False)] + (
                        [(("G", st + 1, mb), s.placement[st + 1] != r)] if st < s.stages - 1
                        else [])
                if any(k not in done for k, _ in needs):
                    break
                free = times[r][-1][1] if times[r] else 0.0
                start = max([free] + [done[k] + (d.p2p if far else 0.0) for k, far in needs])
                end = start + base[a.kind] * (d.stage_scale[st] if d.stage_scale else 1.0)
                times[r].append((start, end))
                if a.kind != "W":
                    done[("F" if a.kind == "F" else "G", st, mb)] = end
                moved = True
    return times


@pytest.mark.parametrize("kind", KINDS)
def test_times_equal_a_plain_reading_of_the_rules(kind: str) -> None:
    rng = random.Random(kind)
    for p, m in ((1, 4), (3, 6), (4, 8)):
        s = build(kind, p, m, 3 if kind == "interleaved-1f1b" else None)
        scale = tuple(rng.uniform(0.5, 2) for _ in range(s.stages))
        for d in (Durations(), Durations(0.3, 0.7, 0.11, 0.05, scale)):
            t = simulate(s, d)
            got = [[(e.start, e.end) for e in ev] for ev in t.events]
            assert got == _plain(s, d)  # to the last bit
            assert t.makespan == max(end for ev in got for _, end in ev)


@pytest.mark.parametrize("kind", KINDS)
def test_messages_are_counted_without_being_built(kind: str) -> None:
    for p, m in ((1, 2), (3, 6), (4, 8)):
        s = build(kind, p, m)
        assert s.num_messages == len(s.messages())


def test_times_are_arrays_the_events_read() -> None:
    t = simulate(build("zb-h1", 3, 4))
    assert not t.start.flags.writeable and not t.end.flags.writeable  # a Timing is frozen
    flat = [e for ev in t.events for e in ev]
    assert [e.start for e in flat] == t.start.tolist()
    assert [e.end for e in flat] == t.end.tolist()
    assert [e.action for e in flat] == [a for r in t.schedule.ranks for a in r]
    assert np.all(t.end - t.start > 0) and t.events is t.events  # built once


def test_the_first_broken_rule_in_rank_order_is_named() -> None:
    f0, f1, b0, b1 = Action("F", 0, 0), Action("F", 1, 0), Action("B", 0, 0), Action("B", 1, 0)
    with pytest.raises(SpecError, match=r"schedule='0X0': has an unknown kind"):
        simulate(_one([[f0, Action("X", 0, 0), Action("F", 5, 0)], [f1, b1]]))
    with pytest.raises(SpecError, match=r"schedule='5F0': is outside 2 stages x 1 micro-batches"):
        simulate(_one([[f0, Action("F", 5, 0), Action("X", 0, 0)], [f1, b1]]))
    with pytest.raises(SpecError, match=r"schedule='0F0': runs twice \(rank 0\)"):
        simulate(_one([[f0, b0, f0, f1], [f1, b1]]))


def test_unequal_stages_by_hand() -> None:
    # Two stages of 3 and 1 layers, one time unit per layer and pass (a full backward is
    # t_b + t_w = 2 units a layer): stage 0's F takes 3 and B 6, stage 1's F 1 and B 2.
    d = Durations(stage_scale=stage_layer_scale((3, 1)))
    # GPipe, m = 4: the forwards end at 3 + 1 + 3·3 = 13, the backwards 6 + 2 + 3·6 = 26
    # later: 39, against (m + p - 1)·(1 + 2)·2 = 30 for the even 2 + 2 split.
    gpipe = simulate(build("gpipe", 2, 4), d)
    assert gpipe.makespan == 39 == gpipe_makespan([3, 1], [6, 2], 4)
    assert simulate(build("gpipe", 2, 4), Durations(stage_scale=(2, 2))).makespan == 30
    # 1F1B, m = 4: rank 0 runs F0 0-3, F1 3-6, then waits for rank 1's B0 (F0 3-4, B0 4-6):
    # B0 6-12, F2 12-15, B1 15-21, F3 21-24, B2 24-30, B3 30-36; rank 1 runs each F as
    # rank 0's ends and its B right after. Busy 4·9 + 4·3 = 48 of 2 x 36.
    one = simulate(build("1f1b", 2, 4), d)
    assert one.makespan == 36 and one.bubble == pytest.approx(1 - 48 / 72)
    starts = [(str(e.action), e.start) for e in one.events[0]]
    assert starts == [("0F0", 0), ("0F1", 3), ("0B0", 6), ("0F2", 12), ("0B1", 15),
                      ("0F3", 21), ("0B2", 24), ("0B3", 30)]
    assert [e.start for e in one.events[1]] == [3, 4, 6, 7, 15, 16, 24, 25]


def test_gpipe_closed_form_holds_for_any_stage_costs() -> None:
    rng = random.Random(3)
    for _ in range(50):
        p, m = rng.randint(1, 6), rng.randint(1, 9)
        layers = tuple(rng.randint(1, 6) for _ in range(p))
        d = Durations(rng.choice([1, 2]), rng.choice([1, 3]), rng.choice([0, 1]),
                      stage_scale=stage_layer_scale(layers, tuple(rng.choice([1, 1.5])
                                                                  for _ in range(p))))
        forward = [d.t_f * x for x in d.stage_scale]
        backward = [(d.t_b + d.t_w) * x for x in d.stage_scale]
        assert simulate(build("gpipe", p, m), d).makespan == pytest.approx(
            gpipe_makespan(forward, backward, m), rel=1e-12)
    with pytest.raises(SpecError, match="gives 1 factors for 2"):
        stage_layer_scale((3, 1), (1.0,))
