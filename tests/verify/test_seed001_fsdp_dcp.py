"""The gloo AVG probe, FSDP2 against one process, and distributed checkpointing, on real ranks.

Each experiment runs in the session's launch at its world size (tests/verify/conftest.py:
the start-up is paid once per world size); fsdp2 also at world size 4. Every check must
pass on every rank, and the checkpoint's ``after`` (no process group) must pass in this
process.
"""

from __future__ import annotations

import math

import pytest

from shardlab.distributed.avg_probe import classify_ratio, needs_force_sum
from shardlab.verify import checkpoint

pytestmark = pytest.mark.multiprocess

EXPECTED_NAMES = {
    "gloo_avg": {"avg_ratio_is_known", "ranks_agree", "fsdp_default_path_matches_probe",
                 "force_sum_path_correct", "workaround_applied_only_when_needed"},
    "fsdp2": {"params_are_shard0_dtensors", "local_numel_fraction",
              "fp32_first_grads_equal_full_batch", "fp32_params_equal_one_process",
              "bf16_sharded_params_stay_fp32", "bf16_params_equal_same_arithmetic",
              "bf16_drift_from_fp32"},
    "checkpoint": {"fresh_model_differs_before_load", "params_roundtrip", "exp_avg_roundtrip",
                   "exp_avg_sq_roundtrip", "step_roundtrip", "resumed_step_identical"},
}
AFTER_NAMES = {"plain_model_differs_before_load", "reshard_to_one_process",
               "dcp_to_torch_save_model", "dcp_to_torch_save_moments"}



def test_ratio_classification() -> None:
    assert classify_ratio(1.0, 2) == "honoured" and not needs_force_sum(1.0, 2)
    assert classify_ratio(4.0, 4) == "summed" and needs_force_sum(4.0, 4)
    assert classify_ratio(1.0 + 1e-9, 4) == "honoured"
    assert classify_ratio(1.5, 2) is None and classify_ratio(math.nan, 2) is None
    with pytest.raises(ValueError, match="neither honoured"):
        needs_force_sum(3.0, 2)


def test_gloo_avg(run_everywhere) -> None:
    results, work = run_everywhere("gloo_avg", 2, EXPECTED_NAMES["gloo_avg"])
    known = {c["name"]: c for c in results[0]}["avg_ratio_is_known"]
    assert "AVG honoured" in known["detail"] or "AVG summed" in known["detail"]
    assert not any(work.iterdir()), "the experiment wrote under work_dir"


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2(run_everywhere, world_size: int) -> None:
    results, work = run_everywhere("fsdp2", world_size, EXPECTED_NAMES["fsdp2"])
    by_name = {c["name"]: c for c in results[0]}
    assert f"1/world = {1 / world_size:.4f}" in by_name["local_numel_fraction"]["detail"]
    assert not any(work.iterdir()), "the experiment wrote under work_dir"


def test_checkpoint_and_reshard(run_everywhere) -> None:
    _, work = run_everywhere("checkpoint", 2, EXPECTED_NAMES["checkpoint"])
    after = checkpoint.after(str(work))
    assert {c["name"] for c in after} >= AFTER_NAMES
    failed = [c for c in after if not c["passed"]]
    assert not failed, failed
    assert sorted(p.name for p in work.iterdir()) == ["ckpt", "consolidated.pt",
                                                      "expected.pt"]
