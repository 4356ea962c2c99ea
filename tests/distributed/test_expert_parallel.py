"""Expert parallelism's single-process parts: the comm meter counts an all-to-all from its
real split sizes and files it under ``ep``, and the routing recorder keeps one record per
MoE forward, none for the forwards full recompute re-runs in backward. (The all-to-all
dispatch itself is checked against one process by the parity runs of
``tests/cli/test_train_cli.py``: losses, gradients through four layouts.)"""

from __future__ import annotations

from dataclasses import replace

import torch

from shardlab.config.model import ModelShape, MoE
from shardlab.distributed.activation_checkpoint import apply_ac
from shardlab.distributed.expert_parallel import RoutingRecorder, moe_layers
from shardlab.distributed.measure import CommMeter, _alltoall_sent
from shardlab.distributed.tensor_parallel import tp_plan
from shardlab.nn.model import TransformerLM

SHAPE = ModelShape("tiny-moe", 3, 32, 4, 64, 16, style="llama", tied=False,
                   moe=MoE(8, 2, 16, shared_experts=1, dense_layers=1))


class _Group:
    """Stands for a process group: this rank's index in it."""

    def __init__(self, rank: int) -> None:
        self._rank = rank

    def rank(self) -> int:
        return self._rank


def test_an_uneven_all_to_all_sends_its_rows_to_the_other_ranks() -> None:
    rows = torch.zeros(7, 4)  # fp32 rows of 16 bytes: 3 stay on rank 1, 4 go to rank 0
    functional = (rows, [5, 2], [4, 3], "group")
    assert _alltoall_sent("all_to_all_single", functional, _Group(1), 112) == 4 * 16
    assert _alltoall_sent("all_to_all_single", functional, _Group(0), 112) == 3 * 16
    c10d = (torch.zeros(7, 4), rows, None, [5, 2], [4, 3])
    assert _alltoall_sent("alltoall_base_", c10d, _Group(1), 112) == 4 * 16
    assert _alltoall_sent("all_to_all_single", (rows, None, None, "g"), _Group(0), 112) is None


def test_dp_and_ep_of_the_same_ranks_file_all_to_alls_under_ep() -> None:
    meter = CommMeter({"dp": (0, 1), "ep": (0, 1), "tp": (0, 2)})
    assert meter._where("all_to_all", (0, 1)) == "ep"
    assert meter._where("reduce_scatter", (0, 1)) == "dp"
    assert meter._where("all_reduce", (0, 2)) == "tp"
    assert meter._where("all_gather", (3,)) == "other"


def test_the_recorder_keeps_one_record_per_moe_forward_under_full_recompute() -> None:
    model = TransformerLM(SHAPE, seed=0)
    apply_ac(model, "full")
    assert [key for key, _ in moe_layers(model)] == [1, 2]
    ids = torch.randint(0, SHAPE.vocab, (2, 16))
    recorder = RoutingRecorder().attach([model])
    model(ids).sum().backward()  # backward re-runs every block's forward
    records = recorder.detach()
    assert [r["layer"] for r in records] == ["1", "2"]
    assert all(sum(r["counts"]) == 2 * 16 * 2 and r["dropped"] == 0 for r in records)
    model(ids)
    assert len(records) == 2  # detached: nothing more recorded


def test_the_tensor_parallel_plan_splits_a_moe_blocks_shared_experts_only() -> None:
    plan = tp_plan(SHAPE)
    assert {"blocks.0.mlp.up_proj", "blocks.0.mlp.gate_proj", "blocks.1.mlp.shared.up_proj",
            "blocks.2.mlp.shared.down_proj", "blocks.2.attn.q_proj"} <= set(plan)
    assert not [k for k in plan if "router" in k or "experts" in k or "blocks.*" in k]
    assert "blocks.1.mlp.up_proj" not in plan
    stage = tp_plan(SHAPE, layers=[2])  # a pipeline stage holding layer 2 only
    assert {k.split(".")[1] for k in stage if k.startswith("blocks.")} == {"2"}
    unshared = replace(SHAPE, moe=replace(SHAPE.moe, shared_experts=0))
    assert not [k for k in tp_plan(unshared) if k.startswith("blocks.1.mlp")]
