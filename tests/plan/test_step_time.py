"""The step-time model: its parts add up, move the right way, and match a hand computation."""

import numpy as np
import pytest

from shardlab.estimate.flops import flops_per_token
from shardlab.estimate.operators import layer_operators
from shardlab.plan.efficiency import fraction_of_peak, matmul_intensity
from shardlab.plan.search import layout_candidates, plan
from shardlab.plan.space import Space
from shardlab.plan.step_time import (
    OPS_PER_LAYER_FORWARD,
    PARTS,
    StepOptions,
    layer_elementwise_elements,
)
from shardlab.spec.catalog import get_model
from shardlab.spec.dtypes import get_policy
from shardlab.spec.hardware import get_accelerator
from shardlab.spec.model import ModelShape

H100 = get_accelerator("h100")
BF16 = get_policy("bf16")


def one(model: ModelShape, gpus: int, batch: int, seq: int, text: str,
        options: StepOptions | None = None) -> dict:
    space = Space(gpus=gpus, global_batch=batch, seq=seq)
    return plan(model, H100, space, BF16, only=layout_candidates(model, space, text),
                options=options).best[0]


def test_parts_add_up_and_mfu_follows() -> None:
    m = get_model("llama-3-70b")
    b = one(m, 64, 64, 4096, "tp=8 pp=4 dp=2 zero=1 sp=1 micro_batch=1 recompute=selective")
    assert sum(b["breakdown"][k] for k in PARTS) == pytest.approx(b["step_seconds"])
    model_flops = flops_per_token(m, 4096).train * 64 * 4096
    assert b["mfu"] == pytest.approx(model_flops / (b["step_seconds"] * 64 * 989e12))
    assert 0.2 < b["mfu"] < 0.74


def test_hand_computed_single_device_step() -> None:
    # One device, no communication: compute = m x 3 x (layers x layer forward + head).
    m = ModelShape("tiny", 2, 1024, 8, vocab=4096, context=512, style="llama", tied=False,
                   d_ff=4096)
    b = one(m, 1, 4, 512, "micro_batch=2", StepOptions(flash=False))
    e = H100.efficiency
    peak = 989e12
    t = 2 * 512

    def mat(k: float, n: float) -> float:
        return 2 * t * k * n / (peak * float(fraction_of_peak(matmul_intensity(t, k, n), e)))

    layer = (mat(1024, 3 * 1024) + mat(1024, 1024) + mat(1024, 2 * 4096) + mat(4096, 1024)
             + 4.0 * t * 512 * 1024 / (peak * float(fraction_of_peak(
                 matmul_intensity(512, 128, 512), e)))
             + OPS_PER_LAYER_FORWARD * e.op_overhead)
    # The memory-bound operators: the operator table's bytes at the memory bandwidth.
    ops = layer_operators(m, H100, batch=2, q_len=512, kv_len=512)
    layer += sum(o.roofline.bytes for o in ops if o.kind != "matmul") / H100.memory_bandwidth
    head = mat(1024, 4096)
    assert b["breakdown"]["compute"] == pytest.approx(2 * 3 * (2 * layer + head))
    for k in ("recompute", "tp_comm", "pp_comm", "dp_comm", "bubble"):
        assert b["breakdown"][k] == 0


def test_parts_move_the_right_way() -> None:
    m = get_model("llama-3-8b")
    base = "dp=8 zero=1 micro_batch=1"
    none = one(m, 8, 64, 4096, base + " recompute=none")
    full = one(m, 8, 64, 4096, base + " recompute=full")
    assert full["breakdown"]["recompute"] > one(m, 8, 64, 4096, base + " recompute=selective"
                                                )["breakdown"]["recompute"]
    assert full["step_seconds"] > none["step_seconds"]
    assert none["memory_per_device"] > full["memory_per_device"]
    tp2 = one(m, 8, 64, 4096, "dp=4 tp=2 zero=1")
    assert tp2["breakdown"]["tp_comm"] > 0 == none["breakdown"]["tp_comm"]
    hidden = one(m, 8, 64, 4096, base)
    exposed = one(m, 8, 64, 4096, base, StepOptions(overlap_dp=False))
    assert exposed["breakdown"]["dp_comm"] > hidden["breakdown"]["dp_comm"]
    # Pipelines: a bubble, shrunk by more micro-batches and by interleaving.
    p4 = one(m, 8, 64, 4096, "dp=2 pp=4 micro_batch=4")
    p4m = one(m, 8, 64, 4096, "dp=2 pp=4 micro_batch=1")
    p4v = one(m, 8, 64, 4096, "dp=2 pp=4 micro_batch=1 virtual=2")
    assert p4["breakdown"]["bubble"] > p4m["breakdown"]["bubble"] > p4v["breakdown"]["bubble"]
    assert p4m["breakdown"]["pp_comm"] > 0
    # Across nodes the data-parallel all-reduce slows down (IB vs NVLink).
    big = one(m, 16, 64, 4096, "dp=16 zero=0", StepOptions(overlap_dp=False))
    small = one(m, 8, 64, 4096, "dp=8 zero=0", StepOptions(overlap_dp=False))
    assert big["breakdown"]["dp_comm"] > 4 * small["breakdown"]["dp_comm"]


def test_efficiency_curve_rises_with_matmul_size() -> None:
    e = H100.efficiency
    sizes = np.array([64, 256, 1024, 4096, 16384])
    f = fraction_of_peak(matmul_intensity(sizes, sizes, sizes), e)
    assert (np.diff(f) > 0).all() and f[-1] < e.peak_fraction


@pytest.mark.parametrize("name", ["gpt2", "llama-3-8b"])
def test_memory_bound_bytes_are_the_operator_tables(name: str) -> None:
    m = get_model(name)
    one = np.array([1])
    elems, soft = layer_elementwise_elements(m, 512, one, np.array([2]), np.array([False]),
                                             flash=False)
    ops = layer_operators(m, H100, batch=2, q_len=512, kv_len=512, bytes_per=1)
    assert elems[0] == pytest.approx(sum(o.roofline.bytes for o in ops if o.kind != "matmul"))
    assert soft[0] == pytest.approx(2 * 2 * m.heads * 512 * 512)
    # Sequence parallelism splits the norms and adds too; a fused kernel has no softmax.
    t4 = np.array([4])
    sp, _ = layer_elementwise_elements(m, 512, t4, np.array([2]), np.array([True]), False)
    assert sp[0] == pytest.approx(elems[0] / 4)
    fused, none = layer_elementwise_elements(m, 512, one, np.array([2]), np.array([False]), True)
    assert none[0] == 0 and fused[0] == pytest.approx(elems[0] - soft[0])
