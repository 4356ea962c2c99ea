"""Each H100 calibration stack left out of the fit in turn (plan/published_unseen.py), and
the figures docs/validation.md states of it. Shares compare with ``pytest.approx(abs=1e-12)``
(the same grid search run twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardlab.plan.published import curve_runs, fit
from shardlab.plan.published_unseen import GPU, Unseen, unseen, unseen_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"


@pytest.fixture(scope="module")
def rows() -> list[Unseen]:
    return unseen()


def test_each_stack_is_left_out_once_and_priced_on_its_own_runs(rows: list[Unseen]) -> None:
    cal = curve_runs(GPU)
    assert [u.calibration for u in rows] == cal
    assert len({u.framework for u in rows}) == len(cal)  # one calibration run per stack
    for u in rows:
        assert u.runs and all(r.framework == u.framework and r.role == "validation"
                              and not r.excluded for r in u.runs)
        if u.framework is None:  # no framework named: the calibration run's own source
            assert {r.source for r in u.runs} == {u.calibration.source}
        assert u.calibration not in u.runs
        again, _ = fit(GPU, free=("peak_fraction",), runs=[r for r in cal
                                                           if r is not u.calibration])
        assert u.without == pytest.approx(again.peak_fraction, abs=1e-12)
        assert len(u.catalog_errors) == len(u.unseen_errors) == len(u.runs)
        if u.without == pytest.approx(u.catalog, abs=1e-3):  # the grid's step is finer
            assert u.unseen_errors == pytest.approx(u.catalog_errors, abs=2e-3)


def test_doc_states_what_an_unseen_stack_costs(rows: list[Unseen]) -> None:
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    _, cat, uns, n = unseen_table(rows)
    assert (f"Stack unseen: {n} held-out H100/H200 runs, mean absolute error {cat:.1%} on the "
            f"catalog's curve, {uns:.1%} fitted without their stack") in text
