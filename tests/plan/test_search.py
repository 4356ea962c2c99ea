"""The search: fast on the largest case, ranked, memory-checked, and one line on bad input."""


import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.errors import SpecError
from shardlab.plan.search import layout_candidates, plan
from shardlab.plan.space import Space

H100 = get_accelerator("h100")
BF16 = get_policy("bf16")


def test_405b_on_16384_h100s_is_ranked() -> None:
    # How fast the search is depends on this CPU: benchmarks/plan_search.py measures it.
    m = get_model("llama-3.1-405b")
    space = Space(gpus=16384, global_batch=2048, seq=8192)
    p = plan(m, H100, space, BF16, top=20)
    assert p.candidates_evaluated > 20000
    assert sum(p.rejected.values()) + p.feasible == p.candidates_evaluated
    steps = [b["step_seconds"] for b in p.best]
    assert steps == sorted(steps)
    assert all(b["fits"] and b["memory_per_device"] <= 0.9 * 80e9 for b in p.best)
    assert all(b["dp"] * b["cp"] * b["tp"] * b["pp"] == 16384 for b in p.best)
    # The winner evaluated on its own gives the same numbers.
    w = p.best[0]
    text = " ".join(f"{k}={w[k if k != 'virtual' else 'virtual_stages']}" for k in
                    ("dp", "tp", "pp", "virtual", "micro_batch", "zero", "recompute",
                     "schedule", "cp", "dp_replicate")) + f" sp={int(w['sp'])}"
    if w["stage_layers"]:
        text += " stage_layers=" + "+".join(map(str, w["stage_layers"]))
    alone = plan(m, H100, space, BF16, only=layout_candidates(m, space, text)).best[0]
    assert alone["step_seconds"] == pytest.approx(w["step_seconds"])
    assert alone["memory_per_device"] == pytest.approx(w["memory_per_device"])


def test_no_usable_layout_and_no_fit_are_spec_errors() -> None:
    m = get_model("llama-3-8b")
    with pytest.raises(SpecError, match="no layout"):
        plan(m, H100, Space(gpus=7, global_batch=8, seq=1024, max_pp=4), BF16)
    with pytest.raises(SpecError, match=r"smallest needs [\d.]+ GB per device"):
        plan(get_model("llama-3.1-405b"), H100, Space(gpus=8, global_batch=8, seq=8192), BF16)


def test_given_layout_is_best_zero_even_when_it_does_not_fit() -> None:
    m = get_model("llama-3-70b")
    space = Space(gpus=8, global_batch=8, seq=4096)
    p = plan(m, H100, space, BF16, only=layout_candidates(m, space, "dp=8 zero=0"))
    b = p.best[0]
    assert (b["dp"], b["tp"], b["pp"], b["zero"]) == (8, 1, 1, 0)
    assert not b["fits"] and p.rejected == {"out of memory": 1}
    with pytest.raises(SpecError, match="tp"):
        layout_candidates(m, space, "tp=3")
    with pytest.raises(SpecError, match="layout"):
        layout_candidates(m, space, "tensor=8")


@pytest.mark.parametrize("value", ["banana", "2", "Y", "-1"])
def test_layout_sp_is_0_or_1_never_read_as_off(value: str) -> None:
    m = get_model("llama-3-8b")
    space = Space(gpus=8, global_batch=8, seq=4096)
    with pytest.raises(SpecError) as e:
        layout_candidates(m, space, f"tp=2 sp={value}")
    assert (e.value.field, e.value.value) == ("sp", value) and "0 or 1" in str(e.value)
    on = layout_candidates(m, space, "tp=2 sp=yes")
    assert bool(on.sp[0]) and not layout_candidates(m, space, "tp=2 sp=0").sp[0]


def test_layout_key_given_twice_is_refused() -> None:
    m = get_model("llama-3-8b")
    with pytest.raises(SpecError, match=r"dp='4': is given twice in --layout \(dp=8 first\)"):
        layout_candidates(m, Space(gpus=8, global_batch=8, seq=4096), "dp=8 dp=4")
