"""Pairs of published runs of one job, and of one series of scales (plan/published_pairs.py):
how they are formed, what they are called, and the figures docs/validation.md states of
them. Ratios are compared with ``pytest.approx(rel=1e-12)`` (a few products and divisions
each way)."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest

from shardlab.plan.choice_kinds import CHOOSER
from shardlab.plan.published import RUNS, predict
from shardlab.plan.published_pairs import (
    CHOICES,
    CLOSE,
    SCALE_KEYS,
    Pair,
    job,
    kind_of,
    pairs,
    series,
    settings,
    summary,
    summary_lines,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"
BY_NAME = {r.name: r for r in RUNS}


@pytest.fixture(scope="module")
def all_pairs() -> list[Pair]:
    return pairs()


def test_a_pair_is_two_checked_runs_of_one_job_in_the_table_order(all_pairs: list[Pair]
                                                                  ) -> None:
    order = {r.name: i for i, r in enumerate(RUNS)}
    assert all_pairs
    for p in all_pairs:
        if p.kind not in ("strong", "weak", "batch"):
            assert job(p.a) == job(p.b)
            assert order[p.a.name] < order[p.b.name]
        else:  # one series: only the devices, the data-parallel degree and the batch move
            assert series(p.a) == series(p.b)
            assert set(p.changes) <= SCALE_KEYS
            assert (p.a.gpus, p.a.global_batch) < (p.b.gpus, p.b.global_batch)
        for r in (p.a, p.b):
            assert not r.excluded and r.role != "unverified"
        assert p.changes, (p.a.name, p.b.name)  # one job run one way twice is no pair


# What a pair's change text cannot show: how the measurement was taken and stated.
UNSHOWN = {"name", "role", "measured_step", "measured_from", "assumed", "checked", "excluded",
           "measured_memory_gib", "memory_figure"}
# What settings() shows: the layout text, the options, the dtype, devices and batch.
SHOWN = {"tp", "pp", "recompute", "sp", "zero", "micro_batch", "virtual", "schedule", "dtype",
         "options", "ep", "etp", "capacity_factor", "cp", "stage_layers", "dp_replicate",
         "gpus", "global_batch"}


def test_runs_of_a_pair_differ_in_nothing_but_what_its_changes_show(all_pairs: list[Pair]
                                                                    ) -> None:
    for p in all_pairs:
        for f in fields(p.a):
            if f.name not in UNSHOWN | SHOWN:
                assert getattr(p.a, f.name) == getattr(p.b, f.name), (p.a.name, p.b.name,
                                                                      f.name)


def test_runs_of_another_release_are_not_paired_and_scales_pair_along_one_line(
        all_pairs: list[Pair]) -> None:
    kinds = {(p.a.name, p.b.name): p.kind for p in all_pairs}
    # NeMo 24.07's and Megatron-Bridge 25.11's Llama 3 8B on 8 H100: two releases.
    assert ("NM Llama3-8B CP2", "MB Llama3-8B FSDP8") not in kinds
    assert kinds[("TT-2 8B FSDP8", "TT-3 8B FSDP8 fp8")] == "precision"
    # One layout at 128 and 256 GB200s, a batch per GPU of 1/2: weak scaling.
    assert kinds[("DGXC Llama3.1-405B GB200 128", "DGXC Llama3.1-405B GB200 256")] == "weak"
    # MegaScale's 768-sequence batch from 256 to 512 GPUs: strong; to the next run only.
    assert kinds[("MS 256 GPUs", "MS 512 GPUs")] == "strong"
    assert ("MS 256 GPUs", "MS 768 GPUs") not in kinds
    # NVIDIA's Nemotron-4 340B at 32 and 512 sequences on 128 GB200s: batch.
    assert kinds[("DGXC Nemotron4-340B GB200 128", "DGXC Nemotron4-340B GB200 128 GBS512")
                 ] == "batch"
    # Different layouts at different scales are neither a choice nor a series.
    assert ("TT-7 70B FSDP32 TP8 fp8", "TT-9 405B 3D 1F1B fp8") not in kinds


def test_ratios_are_the_measured_and_the_predicted_steps(all_pairs: list[Pair]) -> None:
    p = next(p for p in all_pairs if (p.a.name, p.b.name) == ("TA-1 70B bf16", "TA-3 70B fp8"))
    assert p.kind == "precision" and p.changes == {"dtype": ("bf16", "fp8")}
    assert p.measured == pytest.approx(p.b.measured_step / p.a.measured_step, rel=1e-12)
    assert p.predicted == pytest.approx(
        predict(p.b)["step_seconds"] / predict(p.a)["step_seconds"], rel=1e-12)
    assert p.ratio_error == pytest.approx(p.predicted / p.measured - 1, rel=1e-12)


def test_across_scales_the_ratio_is_of_gpu_seconds_per_sequence(all_pairs: list[Pair]
                                                                ) -> None:
    p = next(p for p in all_pairs if (p.a.name, p.b.name) == ("TT-2 8B FSDP8",
                                                               "TT-5 8B FSDP128"))
    assert p.changes == {"dp": ("8", "128"), "global_batch": ("16", "256"),
                         "gpus": ("8", "128")}
    a, b = p.a, p.b
    assert p.measured == pytest.approx(
        (b.measured_step * 128 / 256) / (a.measured_step * 8 / 16), rel=1e-12)
    assert p.predicted == pytest.approx(
        predict(b)["step_seconds"] / predict(a)["step_seconds"], rel=1e-12)


def test_what_differs_names_the_kind() -> None:
    assert kind_of({"dtype": ("bf16", "fp8"), "fp8_params": ("-", "1")}) == "precision"
    assert kind_of({"overlap_tp": ("0", "1")}) == "overlap"
    assert kind_of({"overlap_ep": ("-", "1"), "overlap_tp": ("0", "1")}) == "overlap"
    assert kind_of({"fused_norm": ("0", "1")}) == "kernels"
    assert kind_of({"fused_norm": ("0", "1"), "overlap_tp": ("0", "1")}) == "mixed"
    assert kind_of({"dtype": ("bf16", "fp8"), "overlap_tp": ("0", "1")}) == "mixed"
    assert kind_of({"dtype": ("bf16", "fp8"), "tp": ("8", "4")}) == "layout"
    assert kind_of({"reduce_dtype": ("fp32", "bf16")}) == "other"  # no published record
    assert kind_of({"reduce_dtype": ("fp32", "bf16"), "zero": ("1", "3")}) == "layout"
    assert kind_of({"tp": ("4", "2"), "ep": ("8", "32")}) == "layout"
    assert kind_of({"gpus": ("8", "16"), "dp": ("8", "16")}) == "strong"
    assert kind_of({"gpus": ("8", "16"), "dp": ("8", "16"), "global_batch": ("8", "16")}
                   ) == "weak"
    assert kind_of({"global_batch": ("32", "512")}) == "batch"
    s = settings(BY_NAME["TT-8 70B FSDP32 TP8 fp8 async"])
    assert (s["tp"], s["overlap_tp"], s["dtype"]) == ("8", "1", "fp8")


def test_close_pairs_are_not_scored() -> None:
    a, b = BY_NAME["TA-1 70B bf16"], BY_NAME["TA-2 70B bf16 async"]
    near = Pair(a, b, {"overlap_tp": ("0", "1")}, "overlap", 1 + CLOSE / 2, 0.9)
    far_right = replace(near, measured=0.9, predicted=0.95)
    far_wrong = replace(near, measured=0.9, predicted=1.05)
    tie = replace(near, measured=0.9, predicted=1.0)
    assert near.close and not far_right.close
    assert far_right.agrees and not far_wrong.agrees and not tie.agrees
    s = summary([near, far_right, far_wrong, tie])
    assert (s.count, s.scored, s.agreed) == (4, 3, 1)


def test_every_precision_and_overlap_pair_is_ordered_as_measured(all_pairs: list[Pair]
                                                                 ) -> None:
    # What the fp8 curve and the TP-overlap model are for: the planner must say fp8 and
    # async TP win where the stacks measured that they did.
    for kind in ("precision", "overlap"):
        chosen = [p for p in all_pairs if p.kind == kind and not p.close]
        assert len(chosen) >= 5
        assert all(p.agrees for p in chosen), [(p.a.name, p.b.name) for p in chosen
                                               if not p.agrees]


def test_doc_states_the_pairs_figures(all_pairs: list[Pair]) -> None:
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    for line in summary_lines(all_pairs):
        assert line in text, line


def test_readme_and_guide_state_the_chooser_figures(all_pairs: list[Pair]) -> None:
    root = DOC.parents[1]
    texts = [" ".join((root / f).read_text(encoding="utf-8").split())
             for f in ("README.md", "docs/guide/plan.md")]
    by_kind = {k: summary([p for p in all_pairs if p.kind == k])
               for k in ("precision", "overlap", "mixed", "layout")}
    scales = summary([p for p in all_pairs if p.kind in ("strong", "weak", "batch")])
    p, o, m, lay = (by_kind[k] for k in ("precision", "overlap", "mixed", "layout"))
    assert p.agreed == p.scored == p.count and o.agreed == o.scored == o.count
    assert m.agreed == m.scored == m.count
    for text in texts:
        assert (f"{p.ratio_error:.1%}, {o.ratio_error:.1%} and {m.ratio_error:.1%} on "
                "average") in text
        assert f"{lay.agreed} of {lay.scored} layout pairs" in text
        assert f"{scales.count}" in text and f"within {scales.ratio_error:.1%}" in text
    assert f"all {p.count} fp8-or-bf16 pairs, all {o.count}" in texts[0]
    assert f"Every fp8-or-bf16 pair ({p.count}), every overlap pair ({o.count})" in texts[1]


def test_the_stored_chooser_figures_are_the_pairs_own(all_pairs: list[Pair]) -> None:
    assert set(CHOOSER) == {*CHOICES, "strong", "weak", "batch"}
    for kind, (count, error, scored, agreed) in CHOOSER.items():
        s = summary([p for p in all_pairs if p.kind == kind])
        assert (count, scored, agreed) == (s.count, s.scored, s.agreed), kind
        assert error == pytest.approx(s.ratio_error, abs=5e-4), kind
