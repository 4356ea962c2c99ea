"""Generators: preconditions, placement, every action exactly once, and the size limits."""

import pytest

from shardlab.errors import SpecError
from shardlab.schedules.actions import loop_placement, v_placement
from shardlab.schedules.generators import (
    KINDS,
    MAX_STAGES,
    action_count,
    build,
    check_size,
)
from shardlab.schedules.simulate import simulate


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 4), (4, 8), (4, 12), (5, 10), (8, 16)])
def test_every_action_once_on_its_rank(kind: str, p: int, m: int) -> None:
    if (kind == "dualpipev" and m < 2 * p) or (kind == "interleaved-1f1b" and m % p):
        # Their preconditions (m >= 2p; m a multiple of p): refused with one clear error.
        with pytest.raises(SpecError, match="microbatches"):
            build(kind, p, m)
        return
    s = build(kind, p, m)
    seen = [a for rank in s.ranks for a in rank]
    assert len(seen) == len(set(seen))
    per_pair = 3 if s.splits_backward else 2
    assert len(seen) <= s.stages * m * 3 and len(seen) >= s.stages * m * 2
    for r, actions in enumerate(s.ranks):
        assert all(s.placement[a.stage] == r for a in actions)
    if not s.splits_backward:
        assert len(seen) == s.stages * m * per_pair


def test_placements() -> None:
    assert loop_placement(2, 3) == [0, 1, 0, 1, 0, 1]
    assert v_placement(3) == [0, 1, 2, 2, 1, 0]
    assert build("zb-v", 3, 6).chunk_of_stage == (0, 0, 0, 1, 1, 1)


@pytest.mark.parametrize(("args", "field"), [
    (("ring", 4, 8), "kind"),
    (("1f1b", 0, 8), "stages"),
    (("1f1b", 4, -1), "microbatches"),
    (("interleaved-1f1b", 4, 6, 2), "microbatches"),
    (("interleaved-1f1b", 4, 8, 1), "virtual"),
    (("1f1b", 4, 8, 2), "virtual"),
    (("zb-v", 4, 8, 3), "virtual"),
    (("dualpipev", 4, 7), "microbatches"),
])
def test_preconditions_name_the_field(args: tuple, field: str) -> None:
    with pytest.raises(SpecError) as e:
        build(*args)
    assert e.value.field == field


def test_messages_follow_placement() -> None:
    s = build("1f1b", 3, 2)
    msgs = s.messages()
    # Each micro-batch crosses 2 boundaries forward and 2 backward.
    assert len(msgs) == 2 * 2 * 2
    assert {(m.src_rank, m.dst_rank) for m in msgs if m.kind == "activation"} == {(0, 1), (1, 2)}
    # In a V the turn at the bottom stays on the last rank: no message for it.
    v = build("zb-v", 2, 4)
    assert all(m.src_rank != m.dst_rank for m in v.messages())
    assert len(v.messages()) == 4 * 2 * 2


def test_size_is_checked_without_building() -> None:
    assert check_size("zb-v", 4, 8) == action_count("zb-v", 4, 8, 2) == 192
    assert check_size("1f1b", 4, 8) == simulate(build("1f1b", 4, 8)).schedule.num_actions
    with pytest.raises(SpecError, match="microbatches=9: must be a multiple of stages"):
        check_size("interleaved-1f1b", 4, 9)  # build's own checks come first
    with pytest.raises(SpecError, match=f"stages={MAX_STAGES + 1}: must be <= {MAX_STAGES}"):
        check_size("gpipe", MAX_STAGES + 1, 1)
    with pytest.raises(SpecError, match=r"at most 262,144 \(fewer micro-batches: at most 341\)"):
        check_size("zb-v", 128, 391)


@pytest.mark.parametrize("kind", KINDS)
def test_the_count_bounds_what_build_makes(kind: str) -> None:
    v = 3 if kind == "interleaved-1f1b" else None
    s = build(kind, 4, 8, v)
    n = action_count(kind, 4, 8, s.virtual_stages)
    assert s.num_actions == n or (kind == "dualpipev" and s.num_actions < n)
