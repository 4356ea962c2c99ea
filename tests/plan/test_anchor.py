"""The efficiency curve anchored on one measured step (plan/anchor.py): the root search by
hand on a step of known form, and its refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlab.config.hardware import FP8_PEAK_RATIO, H100_EFFICIENCY, Efficiency
from shardlab.errors import SpecError
from shardlab.plan.anchor import SPAN, TOLERANCE, anchor_efficiency, share
from shardlab.report.plan_view import anchor_line


def step_of(field: str):
    """A step of the planner's form: 2 s that no share moves plus 3 s of matmuls at the
    catalog's 0.650 (3 x 0.650 / share)."""
    calls = []

    def step_at(eff: Efficiency) -> float:
        calls.append(eff)
        return 2.0 + 3.0 * 0.650 / share(eff, field)
    return step_at, calls


@pytest.mark.parametrize("field", ["peak_fraction", "fp8_peak_fraction"])
def test_the_share_that_gives_the_measured_step(field: str) -> None:
    step_at, calls = step_of(field)
    base = replace(H100_EFFICIENCY, fp8_peak_fraction=0.0 if field == "peak_fraction"
                   else 0.650)
    # 4.0 s measured: 3 x 0.650 / x = 2.0, so x = 0.975.
    fitted, before = anchor_efficiency(step_at, base, field, 4.0)
    assert before == pytest.approx(5.0)
    assert getattr(fitted, field) == pytest.approx(0.975, rel=10 * TOLERANCE)
    # Only that field moves (the bf16 share stays when fp8's is fitted).
    assert fitted.peak_fraction == (base.peak_fraction if field != "peak_fraction"
                                    else getattr(fitted, field))
    assert len(calls) < 12  # false position on 1/share is exact for a + b/share


def test_an_unset_fp8_share_reads_as_the_fp8_curve_s() -> None:
    # The bf16 share times the measured fp8 / fp16 asymptote ratio (FP8_PEAK_RATIO); a set
    # share is read as it is.
    unset = replace(H100_EFFICIENCY, fp8_peak_fraction=0.0)
    assert share(unset, "fp8_peak_fraction") == pytest.approx(0.650 * FP8_PEAK_RATIO)
    assert share(replace(unset, fp8_peak_fraction=0.6), "fp8_peak_fraction") == 0.6


@pytest.mark.parametrize(("measured", "says"), [(2.5, "faster than the planner"),
                                                 (60.0, "slower than the planner")])
def test_a_step_no_share_reaches_is_one_line(measured: float, says: str) -> None:
    step_at, _ = step_of("peak_fraction")
    # At the span's ends: 2 + 1.95/1.0 = 3.95 s and 2 + 1.95/0.05 = 41 s.
    assert (2.0 + 1.95 / SPAN[1], 2.0 + 1.95 / SPAN[0]) == pytest.approx((3.95, 41.0))
    with pytest.raises(SpecError, match=f"measured_step={measured}: {says}"):
        anchor_efficiency(step_at, H100_EFFICIENCY, "peak_fraction", measured)


def test_the_line_says_what_moved() -> None:
    line = anchor_line({"measured_step": 4.0, "layout": "tp=8", "field": "peak_fraction",
                        "catalog": 0.65, "fitted": 0.975, "predicted_before": 5.0})
    assert line == ('anchored on your measured run: peak_fraction 0.650 -> 0.975, so that '
                    '"tp=8" takes 4 s as measured (the catalog\'s curve: 5 s, +25.0%)')


def test_a_step_the_share_does_not_move_is_one_line() -> None:
    with pytest.raises(SpecError, match="does not depend on peak_fraction here"):
        anchor_efficiency(lambda e: 5.0, H100_EFFICIENCY, "peak_fraction", 5.0)


def test_a_step_that_jumps_past_the_measurement_is_one_line() -> None:
    # 3 s below share 0.5, 6 s above it: nothing gives 4.5 s.
    with pytest.raises(SpecError, match="no peak_fraction prices this layout at it"):
        anchor_efficiency(lambda e: 6.0 if e.peak_fraction < 0.5 else 3.0, H100_EFFICIENCY,
                          "peak_fraction", 4.5)


def test_a_curve_above_the_span_stays_reachable() -> None:
    # A measured CPU's stored share can exceed 1 (1.01): the search's top follows it.
    base = replace(H100_EFFICIENCY, peak_fraction=1.01)
    fitted, _ = anchor_efficiency(lambda e: 1.0 + 1.0 / e.peak_fraction, base,
                                  "peak_fraction", 1.0 + 1.0 / 1.005)
    assert fitted.peak_fraction == pytest.approx(1.005, rel=1e-4)
