"""The budget page's numbers: the memory variants and the decode curve agree with the budget."""

from __future__ import annotations

import dataclasses

import pytest

from shardlab.config.hardware import get_accelerator
from shardlab.config.layout import make_layout
from shardlab.config.resolve import load_model
from shardlab.estimate.budget import Assumptions, model_budget
from shardlab.report.budget_html import budget_document, budget_sections, decode_curve


@pytest.fixture(scope="module")
def case() -> tuple:
    m = load_model("llama-3-8b")
    lay = make_layout(m, gpus=16, tp=2, pp=2, zero=1, recompute="selective", seq=4096)
    # Eager attention: the s x s scores are what selective recompute drops (with flash,
    # the default, none and selective keep the same activations).
    return m, lay, get_accelerator("H100 SXM"), Assumptions(attention="eager")


def test_memory_variants_are_the_budget_of_each_stage_and_mode(case: tuple) -> None:
    m, lay, acc, a = case
    doc = budget_document(m, lay, acc, a)
    v = doc["memory_variants"]
    assert [(x["zero"], x["recompute"]) for x in v] == [
        (z, r) for r in ("none", "selective", "full") for z in range(4)]
    asked = next(x for x in v if x["zero"] == 1 and x["recompute"] == "selective")
    assert {k: asked[k] for k in doc["memory"]["per_device"]} == doc["memory"]["per_device"]
    other = model_budget(m, dataclasses.replace(lay, zero=3, recompute="full"), acc, a)
    z3 = next(x for x in v if x["zero"] == 3 and x["recompute"] == "full")
    assert z3["total"] == other["memory"]["per_device"]["total"]
    by = {(x["zero"], x["recompute"]): x for x in v}
    for r in ("none", "selective", "full"):  # each ZeRO stage shards more
        assert by[0, r]["total"] > by[1, r]["total"] > by[2, r]["total"] > by[3, r]["total"]
    for z in range(4):  # recompute keeps fewer activations
        assert (by[z, "none"]["activations"] > by[z, "selective"]["activations"]
                > by[z, "full"]["activations"])


def test_decode_curve_meets_capacity_at_the_largest_batch(case: tuple) -> None:
    m, lay, acc, a = case
    doc = budget_document(m, lay, acc, a)
    curve = decode_curve(m, acc, doc)
    cap, best = acc.memory_bytes, doc["inference"]["max_batch"]
    assert curve[0]["batch"] == 1 and curve[-1]["batch"] >= 4 * best
    assert curve[0]["memory_per_device"] == doc["inference"]["memory_per_device"]
    for c in curve:
        assert (c["memory_per_device"] <= cap) == (c["batch"] <= best), c
    tps = [c["tokens_per_s"] for c in curve]
    assert tps == sorted(tps) and tps[0] == pytest.approx(doc["inference"]["decode"]
                                                          ["tokens_per_s"])


def test_sections_and_charts(case: tuple) -> None:
    _, sections = budget_sections(*case, prefix="b")
    assert [s.id for s in sections] == ["b-overview", "b-params", "b-memory", "b-flops",
                                        "b-roofline", "b-inference"]
    names = [c.name for s in sections for c in s.charts]
    assert names == ["b-params", "b-memory", "b-stages", "b-roofline", "b-decode"]
