"""Tensor parallelism, the DTensor redistribute tour and pipelining, on real gloo ranks.

Each experiment runs in the session's launch at its world size (tests/verify/conftest.py:
the start-up is paid once per world size); tensor_parallel and dtensor also at world
size 4, where heads, kv heads and shards change shape. Every check must pass on every
rank.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.multiprocess

EXPECTED_NAMES = {
    "tensor_parallel": {"mlp_output_max_abs_diff", "mlp_weight_grad_max_abs_diff",
                        "mlp_collectives", "attention_output_max_abs_diff",
                        "attention_input_grad_max_abs_diff", "attention_weight_grad_max_abs_diff",
                        "attention_placements", "attention_local_heads"},
    "dtensor": {"distribute_shard0_max_abs_diff", "shard0_to_replicate_collectives",
                     "partial_to_replicate_collectives", "partial_to_shard0_collectives",
                     "shard0_to_shard1_collectives", "full_tensor_max_abs_diff"},
    "pipelining": {"gpipe_microbatch_loss_max_abs_diff", "1f1b_microbatch_loss_max_abs_diff",
                   "gpipe_stage_grad_max_abs_diff", "1f1b_stage_grad_max_abs_diff"},
}


@pytest.mark.parametrize(("name", "world_size"), [
    ("tensor_parallel", 2), ("tensor_parallel", 4),
    ("dtensor", 2), ("dtensor", 4),
    ("pipelining", 2),
])
def test_every_check_passes_on_every_rank(run_everywhere, name: str, world_size: int) -> None:
    _, work = run_everywhere(name, world_size, EXPECTED_NAMES[name])
    assert not any(work.iterdir()), "the experiment wrote under work_dir"
