"""What a published run says it assumed agrees with how it is priced: a run's ``assumed``
lines name its recompute, its precision and its sequence parallelism only as its fields
set them (a shared list of assumptions once told every MPT row it recomputed and every
torchtitan row it ran per-op checkpointing, whatever the row priced)."""

from __future__ import annotations

import re

import pytest

from shardlab.plan.published import RUNS
from shardlab.plan.published_run import PublishedRun
from shardlab.plan.runs_memory import MEMORY_ONLY_RUNS

ALL = list(RUNS) + list(MEMORY_ONLY_RUNS)


def _said(run: PublishedRun) -> str:
    return " | ".join(run.assumed).lower()


@pytest.mark.parametrize("run", ALL, ids=lambda r: r.name)
def test_assumptions_agree_with_the_priced_fields(run: PublishedRun) -> None:
    said = _said(run)
    if "activation checkpointing = full recompute" in said:
        assert run.recompute == "full"
    if "per-op selective activation checkpointing priced as selective" in said:
        assert run.recompute == "selective"
    if re.search(r"(?<!per-layer )\bno recompute\b", said):
        assert run.recompute == "none"
    if said.startswith("fp8") or " | fp8:" in said or "fp8 through" in said:
        assert run.dtype == "fp8"
    if "sequence parallel with tp" in said and run.tp > 1:
        assert run.sp


def test_the_shared_lists_now_vary_by_row() -> None:
    by_name = {r.name: r for r in ALL}
    # MosaicML: the 70B rows recompute, the 7B large-scale rows do not, and say so.
    assert "activation checkpointing = full" in _said(by_name["MPT-1 70b"])
    assert "activation checkpointing" not in _said(by_name["MPT-6 7b"])
    # torchtitan: per-op SAC only on the selective rows, fp8 scaling only on fp8 ones.
    assert "per-op selective" in _said(by_name["TT-2 8B FSDP8"])
    assert "per-op selective" not in _said(by_name["TT-9 405B 3D 1F1B fp8"])
    assert "tensorwise" in _said(by_name["TT-3 8B FSDP8 fp8"])
    assert "tensorwise" not in _said(by_name["TT-2 8B FSDP8"])
