"""A MoE model on virtual devices with expert parallelism equals one device, and its counted
all-to-all, gradient and state bytes equal the cost model's.

float64 throughout: losses and parameters within the simulator's float64 tolerance
(1e-12 relative), bytes exactly (tolerance 0), as the dense layouts of test_engine.py.
"""

import pytest
import torch

from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError
from shardlab.estimate.expert import expert_alltoall_bytes
from shardlab.nn.data import Batch, batches
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.moe import MoEOptions
from shardlab.sim import run
from shardlab.sim.engine import Parallel
from shardlab.sim.run import layout_for, simulate_run

V = garden_vocab().size
# The tiny MoE: 8 experts, top-2, 1 shared expert, 1 dense layer (then 1 MoE layer).
EXPERTS = MoE(experts=8, experts_per_token=2, expert_d_ff=16, shared_experts=1,
              dense_layers=1)
LLAMA = ModelShape("moe", 2, 32, 4, V, 16, kv_heads=2, d_ff=64, style="llama", tied=False,
                   moe=EXPERTS)
GPT = ModelShape("moe-gpt", 2, 32, 4, V, 16, style="gpt", tied=True, moe=EXPERTS)
AUX = MoEOptions(aux_coef=0.01, z_coef=0.001)


def _batches(n: int, size: int = 8) -> list[Batch]:
    stream = batches(garden_documents(200, 1), size, 16, seed=1)
    return [next(stream) for _ in range(n)]


LAYOUTS = [
    (LLAMA, Parallel(dp=2, ep=2), AUX, 2),                                  # ep=2
    # ep x dp: experts' gradients reduced over expert_dp = 2, capacity dropping.
    (LLAMA, Parallel(dp=4, ep=2, zero=1), MoEOptions(0.01, 0, 1.0), 1),
    (GPT, Parallel(dp=2, ep=2, pp=2, microbatches=2, zero=3), AUX, 1),      # with pp, ZeRO-3
    (LLAMA, Parallel(dp=2, ep=2, tp=2), AUX, 1),                            # tp for the dense
    (LLAMA, Parallel(dp=4, ep=4, zero=2), AUX, 1),                          # one expert pair each
]


@pytest.mark.parametrize(("shape", "par", "opts", "steps"), LAYOUTS,
                         ids=lambda v: f"dp{v.dp}ep{v.ep}tp{v.tp}pp{v.pp}z{v.zero}"
                         if isinstance(v, Parallel) else None)
def test_moe_equals_one_device_and_the_cost_model(shape: ModelShape, par: Parallel,
                                                  opts: MoEOptions, steps: int) -> None:
    r = simulate_run(shape, par, _batches(steps), torch.float64, moe=opts)
    failed = [(c.name, c.value, c.tolerance) for c in r.checks if not c.passed]
    assert not failed, failed
    assert r.max_param_diff <= 1e-12 and r.max_loss_diff <= 1e-12
    # Not vacuous: every device sent tokens to the other members of its ep group.
    counted = r.comm["ep"]["counted_bytes"]
    on_moe_stage = [c for i, c in enumerate(counted) if par.pp == 1 or (i // par.tp) % par.pp]
    assert all(c > 0 for c in on_moe_stage) and r.routing_imbalance > 1


def test_counted_all_to_all_bytes_are_the_routers_counts_through_the_cost_model() -> None:
    """Four members of uneven load send different bytes, each exactly what
    expert_alltoall_bytes makes of the counts its group's routers produced."""
    r = simulate_run(LLAMA, Parallel(dp=4, ep=4), _batches(1), torch.float64, moe=AUX)
    counted = r.comm["ep"]["counted_bytes"]
    assert counted == r.comm["ep"]["predicted_bytes"] and len(set(counted)) > 1
    balanced = expert_alltoall_bytes(LLAMA, r.layout)  # the mean rank, balanced routing
    assert min(counted) < balanced < max(counted)


def test_the_reference_must_see_the_devices_token_groups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The load-balancing loss is a function of one forward's tokens: a reference that ran
    the whole global batch at once would train another model."""

    class WholeBatch(run.Reference):
        def __init__(self, model: object, opt: object, groups: int = 1) -> None:
            super().__init__(model, opt, 1)

    monkeypatch.setattr(run, "Reference", WholeBatch)
    r = simulate_run(LLAMA, Parallel(dp=2, ep=2), _batches(1), torch.float64, moe=AUX)
    assert [c.name for c in r.checks if not c.passed] == ["params"]


@pytest.mark.parametrize(("par", "field"), [
    (Parallel(dp=3, ep=3), "ep"), (Parallel(dp=2, ep=4), "ep"),
    (Parallel(dp=2, ep=2, tp=2, sp=True), "sp"),
])
def test_bad_expert_layouts_refused_before_work(par: Parallel, field: str) -> None:
    with pytest.raises(SpecError) as e:
        layout_for(LLAMA, par, 12, 16, torch.float64)
    assert e.value.field == field
