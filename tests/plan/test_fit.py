"""Fit advice: what binds, and each change priced exactly as budget and plan price it."""

import dataclasses
from typing import Any

import pytest

from shardlab.cli import main
from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.config.layout import Layout, make_layout
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.estimate.budget import Assumptions, model_budget
from shardlab.estimate.memory import stage_memory
from shardlab.plan import fit as fit_module
from shardlab.plan.fit import CATEGORIES, PAIRS_KEPT, FitChange, explain_fit
from shardlab.plan.options import step_options_for
from shardlab.plan.search import USABLE_MEMORY, layout_candidates, plan
from shardlab.plan.space import Space

H100 = get_accelerator("h100")
LLAMA3_8B = get_model("llama-3-8b")


def _changed(model: ModelShape, base: Layout, c: FitChange) -> Layout:
    """The layout a change describes, built the way ``shardlab budget`` builds one."""
    k = c.knobs
    return make_layout(model, gpus=base.gpus, dp=k.dp, tp=k.tp, pp=k.pp,
                       virtual_stages=k.virtual_stages, zero=k.zero, sp=k.sp,
                       micro_batch=k.micro_batch, global_batch=base.global_batch, seq=base.seq,
                       recompute=k.recompute, dtype=base.dtype.name, schedule=k.schedule,
                       cp=k.cp, stage_layers=k.stage_layers, dp_replicate=k.dp_replicate)


def _layout_text(c: FitChange) -> str:
    """The change's whole layout as ``plan --layout`` reads it."""
    k = c.knobs
    return (f"dp={k.dp} tp={k.tp} pp={k.pp} virtual={k.virtual_stages} zero={k.zero} "
            f"sp={int(k.sp)} micro_batch={k.micro_batch} recompute={k.recompute} "
            f"schedule={k.schedule} cp={k.cp} dp_replicate={k.dp_replicate}"
            + (" stage_layers=" + "+".join(map(str, k.stage_layers)) if k.stage_layers else ""))


def test_llama3_8b_at_8192_names_activations_and_the_pair_that_fits() -> None:
    """The issue's case: 8 x H100, ZeRO-0, micro-batch 8 of 8,192 tokens is 455 GB."""
    lay = make_layout(LLAMA3_8B, gpus=8, zero=0, micro_batch=8, seq=8192)
    a = explain_fit(LLAMA3_8B, lay, H100, capacity=H100.memory_bytes)
    assert not a.fits and a.binding == "activations" and a.stage == 0
    assert a.memory_bytes == pytest.approx(455.5e9, rel=1e-3)
    assert a.by_category["activations"] == max(a.by_category.values())
    # Without any activations the states (16 bytes x 8.03 B parameters) still do not fit.
    assert a.without["activations"] == pytest.approx(16 * 8_030_261_248)
    assert a.without["activations"] > a.capacity
    assert not any(c.fits for c in a.changes)
    assert {c.change for c in a.changes} == {
        "zero=1", "zero=2", "zero=3", "recompute=selective", "recompute=full",
        "micro_batch=4", "tp=2 dp=4", "pp=2 dp=4", "cp=2 dp=4"}
    memory = [c.memory_bytes for c in a.changes]
    assert memory == sorted(memory)  # none fits: smallest first
    assert a.skipped == [("sp=1", "sequence parallelism needs tp > 1")]
    assert [c.change for c in a.pairs] == ["zero=3 recompute=full"]
    best = a.pairs[0]
    assert best.fits and best.memory_bytes == pytest.approx(67.94e9, rel=1e-3)
    assert best.step_ratio == pytest.approx(best.step_seconds / a.step_seconds)
    assert 1.0 < best.step_ratio < 1.5  # full recompute: about one more forward


def test_every_change_equals_a_fresh_budget_and_plan_of_the_changed_layout() -> None:
    lay = make_layout(LLAMA3_8B, gpus=8, zero=0, micro_batch=8, seq=8192)
    a = explain_fit(LLAMA3_8B, lay, H100, capacity=H100.memory_bytes)
    base = model_budget(LLAMA3_8B, lay, H100, Assumptions())["memory"]
    assert a.memory_bytes == base["per_device"]["total"]
    # Without a framework's memory facts there is no transient peak beyond the four.
    assert a.by_category == {**{c: base["per_device"][c] for c in CATEGORIES},
                             "transient": 0.0}
    space = Space(gpus=8, global_batch=lay.global_batch, seq=lay.seq)
    bf16 = get_policy("bf16")
    given = plan(LLAMA3_8B, H100, space, bf16, only=layout_candidates(
        LLAMA3_8B, space, "dp=8 micro_batch=8 zero=0")).best[0]
    assert a.step_seconds == pytest.approx(given["step_seconds"], rel=1e-12)
    for c in [*a.changes, *a.pairs]:
        mem = model_budget(LLAMA3_8B, _changed(LLAMA3_8B, lay, c), H100, Assumptions())
        d = mem["memory"]["per_device"]
        assert c.memory_bytes == pytest.approx(d["total"], rel=1e-12), c.change
        assert c.by_category == pytest.approx({**{k: d[k] for k in CATEGORIES},
                                               "transient": 0.0}, rel=1e-12)
        assert c.fits == mem["memory"]["fits"]
        p = plan(LLAMA3_8B, H100, space, bf16,
                 only=layout_candidates(LLAMA3_8B, space, _layout_text(c))).best[0]
        assert c.step_seconds == pytest.approx(p["step_seconds"], rel=1e-12), c.change
        assert c.memory_bytes == pytest.approx(p["memory_per_device"], rel=1e-12)


def test_pairs_are_the_fastest_few_that_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Held to 180 GB, the same layout fits no single change but many pairs.
    lay = make_layout(LLAMA3_8B, gpus=8, zero=0, micro_batch=8, seq=8192)
    a = explain_fit(LLAMA3_8B, lay, H100, capacity=180e9)
    assert not any(c.fits for c in a.changes)
    assert len(a.pairs) == PAIRS_KEPT and all(c.fits for c in a.pairs)
    assert [c.step_seconds for c in a.pairs] == sorted(c.step_seconds for c in a.pairs)
    assert a.pairs[0].change == "zero=3 micro_batch=4"
    # The same doubling twice is among the pairs priced (kept when more are kept).
    monkeypatch.setattr(fit_module, "PAIRS_KEPT", 10)
    more = explain_fit(LLAMA3_8B, lay, H100, capacity=180e9).pairs
    assert more[:PAIRS_KEPT] == a.pairs
    assert "tp=4 dp=2" in {c.change for c in more}


def test_what_fits_comes_fastest_first_then_the_rest_by_memory() -> None:
    # ZeRO-0 states (128 GB) bind at 4,096 tokens: every ZeRO stage and tp=2 fit.
    lay = make_layout(LLAMA3_8B, gpus=8, zero=0, micro_batch=1, seq=4096)
    a = explain_fit(LLAMA3_8B, lay, H100, capacity=H100.memory_bytes)
    assert a.binding == "optimizer" and not a.pairs
    fitting = [c for c in a.changes if c.fits]
    rest = [c for c in a.changes if not c.fits]
    assert a.changes == fitting + rest
    assert {c.change for c in fitting} >= {"zero=1", "zero=2", "zero=3"}
    assert [c.step_seconds for c in fitting] == sorted(c.step_seconds for c in fitting)
    assert [c.memory_bytes for c in rest] == sorted(c.memory_bytes for c in rest)
    assert ("halve micro_batch", "micro_batch=1 cannot be halved") in a.skipped


def test_the_binding_category_is_the_one_whose_removal_lowers_the_peak_most() -> None:
    model = get_model("llama-3-70b")
    lay = make_layout(model, gpus=64, tp=8, pp=8, zero=0, micro_batch=2, global_batch=64,
                      seq=8192)
    a = explain_fit(model, lay, H100, capacity=H100.memory_bytes)
    stages = stage_memory(model, lay, False, True)
    parts = [{"weights": s.states.weights, "gradients": s.states.gradients,
              "optimizer": s.states.optimizer, "activations": s.activations} for s in stages]
    for cat in CATEGORIES:
        assert a.without[cat] == pytest.approx(max(s.total - p[cat]
                                                   for s, p in zip(stages, parts, strict=True)))
    assert a.binding == min(CATEGORIES, key=lambda cat: a.without[cat])
    # dp = 1 and tp = 8 (a node): no ZeRO, no wider tp, no deeper pp; each said why.
    reasons = dict(a.skipped)
    assert reasons["zero=1..3"].startswith("dp=1")
    assert reasons["tp=16"] == "tp=16 would leave a node of 8"
    assert reasons["pp=16"].startswith("dp=1 cannot be halved")


def test_changes_the_model_rules_out_are_skipped_with_the_rule() -> None:
    gpt2 = get_model("gpt2")  # 12 heads: tp=8 does not divide them
    lay = make_layout(gpt2, gpus=8, tp=4, zero=0, micro_batch=64, global_batch=128)
    a = explain_fit(gpt2, lay, H100, capacity=1e9)
    assert ("tp=8 dp=1", "tp does not divide heads, kv heads or d_ff") in a.skipped
    assert all(c.knobs.tp == 4 for c in a.changes)
    tiny = ModelShape("tiny", 2, 64, 4, vocab=128, context=64, style="llama", tied=False,
                      d_ff=128)
    lay = make_layout(tiny, gpus=8, pp=2, micro_batch=4, global_batch=32)
    a = explain_fit(tiny, lay, H100, capacity=1e3)
    assert ("pp=4 dp=2", "pp x virtual stages exceeds the layers") in a.skipped
    # Nothing fits 1 KB: the pair that comes closest, said not to fit.
    assert len(a.pairs) == 1 and not a.pairs[0].fits


def test_this_machine_tries_only_what_train_runs() -> None:
    lay = make_layout(LLAMA3_8B, gpus=8, zero=0, micro_batch=8, seq=8192)
    a = explain_fit(LLAMA3_8B, lay, H100, capacity=H100.memory_bytes, train_only=True)
    assert "zero=1" not in {c.change for c in a.changes}
    # shardlab train runs no DDP (ZeRO-0) with tp > 1.
    assert ("tp=2 dp=4", "not supported by shardlab train") in a.skipped
    assert all(c.knobs.zero in (0, 2, 3) for c in [*a.changes, *a.pairs])


def test_a_layout_that_fits_says_so_and_pairs_stay_empty() -> None:
    lay = make_layout(LLAMA3_8B, gpus=8, zero=3, micro_batch=1, seq=4096)
    a = explain_fit(LLAMA3_8B, lay, H100, capacity=USABLE_MEMORY * H100.memory_bytes)
    assert a.fits and not a.pairs and a.memory_bytes <= a.capacity
    d: dict[str, Any] = a.as_dict()
    assert d["over_bytes"] < 0 and d["binding"] in CATEGORIES


@pytest.mark.parametrize("capacity", [0.0, -1.0, float("nan"), float("inf")])
def test_a_capacity_that_is_no_number_of_bytes_is_refused(capacity: float) -> None:
    lay = make_layout(LLAMA3_8B, gpus=8)
    with pytest.raises(SpecError, match=r"capacity=.*must be a finite number of bytes > 0"):
        explain_fit(LLAMA3_8B, lay, H100, capacity=capacity)


def test_a_moe_layout_is_offered_more_expert_parallelism_priced_as_budget_prices_it() -> None:
    mixtral = get_model("mixtral-8x7b")
    lay = make_layout(mixtral, gpus=16, ep=2, zero=1, seq=4096, global_batch=16)
    a = explain_fit(mixtral, lay, H100, capacity=40e9)
    ep = next(c for c in a.changes if c.change == "ep=4")
    assert (ep.knobs.ep, ep.knobs.dp) == (4, 16) and ep.memory_bytes < a.memory_bytes
    changed = make_layout(mixtral, gpus=16, ep=4, zero=1, seq=4096, global_batch=16)
    doc = model_budget(mixtral, changed, H100, Assumptions(dropout=False))
    assert ep.memory_bytes == pytest.approx(doc["memory"]["per_device"]["total"], rel=1e-12)
    tp = next(c for c in a.changes if c.change.startswith("tp=2"))
    assert (tp.knobs.ep, tp.knobs.etp, tp.knobs.dp) == (2, 2, 8)
    whole = explain_fit(mixtral, make_layout(mixtral, gpus=16, ep=8, zero=1, seq=4096,
                                             global_batch=16), H100, capacity=40e9)
    assert ("ep=16", "ep=16 must divide dp (16) and the experts (8)") in whole.skipped


@pytest.mark.parametrize("layout", [
    make_layout(LLAMA3_8B, gpus=8, zero=3, recompute="full", seq=2048),
    make_layout(LLAMA3_8B, gpus=16, tp=2, pp=2, zero=1, sp=True, micro_batch=2,
                global_batch=64, seq=4096, recompute="selective"),
])
def test_layout_memory_without_facts_is_the_budgets_and_with_them_adds_a_transient(
        layout: Layout) -> None:
    plain = fit_module.layout_memory(LLAMA3_8B, layout, step_options_for(H100, flash=True),
                                     dropout=False)
    peak = max(stage_memory(LLAMA3_8B, layout, False, True), key=lambda s: s.total)
    assert plain["transient"] == 0.0
    assert plain["total"] == pytest.approx(peak.total, rel=1e-12)
    megatron = fit_module.layout_memory(
        LLAMA3_8B, layout, step_options_for(H100, flash=True, framework="megatron"),
        dropout=False)
    # Megatron-LM's fp32 main gradients at least (the pipeline's first rank has no loss).
    assert megatron["gradients"] > plain["gradients"] and megatron["total"] > plain["total"]
    assert megatron["total"] == pytest.approx(sum(megatron[k] for k in (*CATEGORIES,
                                                                        "transient")))


QWEN_MIXED = dataclasses.replace(  # 4 dense layers before 44 MoE layers
    get_model("qwen3-30b-a3b"), moe=dataclasses.replace(get_model("qwen3-30b-a3b").moe,
                                                        dense_layers=4))
FRAMEWORK_CASES = [
    ("megatron", LLAMA3_8B, 16, "dp=8 tp=2 zero=1 sp=1 micro_batch=4 recompute=selective"),
    ("torchtitan", LLAMA3_8B, 16, "dp=8 tp=2 zero=1 sp=1 micro_batch=4 recompute=selective"),
    ("megatron", LLAMA3_8B, 16,
     "dp=2 tp=2 pp=4 virtual=2 zero=1 sp=1 micro_batch=4 recompute=none schedule=zb-v"),
    ("megatron", LLAMA3_8B, 16,
     "dp=2 tp=2 pp=4 zero=1 sp=1 micro_batch=4 recompute=none stage_layers=5+9+9+9"),
    ("torchtitan", QWEN_MIXED, 16, "dp=8 pp=2 ep=8 zero=3 micro_batch=2 recompute=none"),
]


@pytest.mark.parametrize(("framework", "model", "gpus", "text"), FRAMEWORK_CASES)
def test_under_a_framework_the_advice_counts_memory_as_plan_does(
        framework: str, model: ModelShape, gpus: int, text: str) -> None:
    """One view: with a framework's memory facts, the current figure (rank by rank: pp > 1
    under a V schedule, an uneven split, dense and MoE layers) and every change's are what
    ``plan --framework`` says for that layout, transient included, and so are the
    verdicts; not budget's states and saved activations."""
    options = step_options_for(H100, flash=True, framework=framework)
    space = Space(gpus=gpus, global_batch=64, seq=8192, expert_fold=True)
    bf16 = get_policy("bf16")

    def planned(layout: str) -> tuple[dict[str, Any], float]:
        p = plan(model, H100, space, bf16, options=options,
                 only=layout_candidates(model, space, layout))
        return p.best[0], p.device_memory

    given, usable = planned(text)
    g = given
    lay = make_layout(model, gpus=gpus, dp=g["dp"], tp=g["tp"], pp=g["pp"],
                      virtual_stages=g["virtual_stages"], zero=g["zero"], sp=g["sp"],
                      micro_batch=g["micro_batch"], global_batch=64, seq=8192,
                      recompute=g["recompute"], schedule=g["schedule"], ep=g["ep"],
                      etp=g["etp"], stage_layers=g["stage_layers"], expert_fold=True)
    a = explain_fit(model, lay, H100, capacity=usable, dropout=False, options=options)
    assert a.memory_facts and a.as_dict()["memory_facts"] is True
    assert a.fits == given["fits"] is False
    assert a.memory_bytes == pytest.approx(given["memory_per_device"], rel=1e-12)
    assert a.by_category == pytest.approx(
        {k: given["memory_breakdown"][k] for k in a.by_category}, rel=1e-12)
    assert a.memory_bytes == pytest.approx(sum(a.by_category.values()), rel=1e-12)
    budget_view = max(stage_memory(model, lay, False, True), key=lambda s: s.total)
    assert a.memory_bytes != pytest.approx(budget_view.total, rel=1e-3)
    assert a.step_seconds == pytest.approx(given["step_seconds"], rel=1e-12)
    for c in a.changes:
        p, _ = planned(_layout_text(c) + (f" ep={c.knobs.ep}" if model.moe else ""))
        assert c.memory_bytes == pytest.approx(p["memory_per_device"], rel=1e-12), c.change
        assert c.fits == p["fits"], c.change


def test_the_footnote_names_the_count(capsys: pytest.CaptureFixture[str]) -> None:
    """Memory facts with no transient on the busiest rank still say the plan's count."""
    code = main(["plan", "llama-3-8b", "--gpus", "16", "--seq", "8192", "--global-batch",
                 "64", "--framework", "megatron", "--layout",
                 "dp=2 tp=2 pp=4 micro_batch=4 zero=1 recompute=none sp=1 schedule=1f1b"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "What binds" in out
    assert "as `plan` counts it with the framework's memory facts" in out
    assert "as `budget` counts them" not in out
    code = main(["plan", "llama-3-8b", "--gpus", "8", "--seq", "4096", "--global-batch", "64",
                 "--layout", "dp=8 micro_batch=1 zero=0"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "states and saved activations, as `budget` counts them" in out
