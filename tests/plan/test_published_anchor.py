"""What one measured run buys on the published runs (plan/published_anchor.py), and the
figures docs/validation.md states of it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from shardlab.plan.published import RUNS, predict
from shardlab.plan.published_anchor import anchor_family, anchored_table, families

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"


def test_families_keep_the_table_order_and_drop_lone_runs() -> None:
    groups = families()
    assert all(len(g) > 1 for g in groups)
    order = {r.name: i for i, r in enumerate(RUNS)}
    for g in groups:
        assert [order[r.name] for r in g] == sorted(order[r.name] for r in g)
        assert len({(r.source, r.gpu, r.dtype, r.model.name) for r in g}) == 1
        assert not any(r.excluded or r.role == "unverified" for r in g)


def test_the_anchor_is_priced_at_its_measurement() -> None:
    group = next(g for g in families() if g[0].name == "DGXC Grok1-314B GB200 128 BF16")
    fam = anchor_family(group)
    assert fam is not None and fam.field == "peak_fraction"
    a = fam.anchor
    eff = a.accelerator().efficiency
    assert eff is not None
    anchored = replace(eff, peak_fraction=fam.fitted)
    assert predict(a, anchored)["step_seconds"] == pytest.approx(a.measured_step, rel=1e-4)
    # Its two siblings (the same model and release on 256 and 512 GPUs) move from 10-12%
    # slow to within a few percent.
    assert len(fam.runs) == 2
    assert min(abs(e) for e in fam.zero_shot) > 0.10
    assert max(abs(e) for e in fam.anchored) < 0.03


def test_an_anchor_out_of_reach_keeps_the_catalog() -> None:
    group = next(g for g in families() if g[0].name == "ZQ Qwen3-235B FSDP EP8")
    fam = anchor_family(group)
    assert fam is not None and fam.fitted == fam.catalog
    assert fam.anchored == fam.zero_shot


def test_doc_states_what_one_measured_run_buys() -> None:
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    for by_model in (True, False):
        _, zero, anchored, n = anchored_table(by_model=by_model)
        label = "One model" if by_model else "One stack, any model"
        assert (f"{label}: {n} runs predicted, mean absolute error {zero:.1%} on the catalog's "
                f"curve, {anchored:.1%} anchored") in text
