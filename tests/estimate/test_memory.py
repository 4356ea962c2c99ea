"""Memory per device: ZeRO states (Rajbhandari et al. 2020) and pipeline in-flight counts."""

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import POLICIES, get_policy
from shardlab.config.layout import make_layout
from shardlab.estimate.memory import (
    inflight_microbatches,
    peak_stage,
    stage_memory,
    zero_state_bytes,
)
from shardlab.estimate.params import count_params

BF16 = get_policy("bf16")


def test_zero_paper_formulas() -> None:
    # ZeRO paper Fig. 1: Ψ = 7.5B, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.88 GB.
    psi, nd = 7.5e9, 64
    totals = [zero_state_bytes(psi, BF16, z, nd).total / 1e9 for z in range(4)]
    assert_close(totals, [120.0, 31.40625, 16.640625, 1.875], rtol=1e-12, atol=0)
    s1 = zero_state_bytes(psi, BF16, 1, nd)
    assert (s1.weights, s1.gradients, s1.optimizer) == (2 * psi, 2 * psi, 12 * psi / nd)


@given(st.floats(1e3, 1e12), st.integers(1, 4096), st.sampled_from(sorted(POLICIES)))
def test_zero3_times_dp_equals_stage0(psi: float, dp: int, policy: str) -> None:
    p = get_policy(policy)
    assert_close(zero_state_bytes(psi, p, 3, dp).total * dp, zero_state_bytes(psi, p, 0, dp).total,
                 rtol=1e-12, atol=0)


@given(st.floats(1e3, 1e12), st.integers(1, 4096))
def test_each_stage_saves_memory(psi: float, dp: int) -> None:
    totals = [zero_state_bytes(psi, BF16, z, dp).total for z in range(4)]
    assert all(a >= b for a, b in pairwise(totals))


def test_policy_bytes() -> None:
    assert BF16.state_bytes == 16
    assert get_policy("fp32").state_bytes == 16
    assert (get_policy("fp32").weight_bytes, get_policy("fp32").optimizer_bytes) == (4, 8)


@pytest.mark.parametrize(("schedule", "p", "m", "v", "want"), [
    ("gpipe", 4, 16, 1, [16, 16, 16, 16]),
    ("1f1b", 4, 16, 1, [4, 3, 2, 1]),
    ("1f1b", 4, 2, 1, [2, 2, 2, 1]),
    ("zb-h1", 4, 16, 1, [4, 4, 4, 4]),
    ("zb-h2", 4, 16, 1, [7, 7, 7, 7]),
    ("zb-v", 4, 16, 2, [4, 4, 4, 4]),
    ("dualpipev", 4, 16, 2, [4.5, 4.5, 4.5, 4.5]),
])
def test_inflight(schedule: str, p: int, m: int, v: int, want: list[int]) -> None:
    assert [inflight_microbatches(schedule, p, r, m, v) for r in range(p)] == want


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (8, 3), (16, 4)])
def test_interleaved_first_stage_factor(p: int, v: int) -> None:
    # Korthikanti 2022 Sec. 4.2.3: p·(1 + (p-1)/(p·v)) on the first stage.
    got = inflight_microbatches("interleaved-1f1b", p, 0, 64 * p, v)
    assert_close(got, p * (1 + (p - 1) / (p * v)), rtol=1e-12, atol=0)


def test_stage_params_sum_to_total_and_fit_verdict() -> None:
    m = get_model("llama-3-8b")
    lay = make_layout(m, pp=4, global_batch=8)
    stages = stage_memory(m, lay, dropout=False)
    assert sum(s.params for s in stages) == count_params(m).total
    assert stages[0].inflight == 4 and stages[3].inflight == 1
    big = get_model("gpt3-175b")
    assert peak_stage(stage_memory(big, make_layout(big), True)).total > 80e9


def test_single_device_total_is_states_plus_layers() -> None:
    m = get_model("gpt2")
    lay = make_layout(m, micro_batch=4, dtype="fp32")
    (s,) = stage_memory(m, lay, dropout=True)
    assert s.states.total == 16 * count_params(m).total
    assert s.activations > 12 * 4 * 1024 * 768 * 34  # at least the 12 layers' linear terms
