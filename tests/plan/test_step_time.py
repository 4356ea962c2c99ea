"""The step-time model: its parts add up, move the right way, and match a hand computation."""

import dataclasses

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import OPS_PER_LAYER_FORWARD, Accelerator, Link, get_accelerator
from shardlab.config.measured import NAME
from shardlab.config.model import ModelShape
from shardlab.config.runtime import Overhead, Runtime
from shardlab.errors import SpecError
from shardlab.estimate.flops import flops_per_token
from shardlab.estimate.operators import layer_operators
from shardlab.plan.efficiency import fraction_of_peak, matmul_intensity
from shardlab.plan.layer_time import layer_forward, probe_elementwise_bandwidth
from shardlab.plan.memory_bound import layer_elementwise_elements
from shardlab.plan.search import device_of, layout_candidates, plan
from shardlab.plan.space import Space
from shardlab.plan.step_time import (
    PARTS,
    StepOptions,
)

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
    # The loss: a fused kernel's 6 bytes per logit (the planner's default), memory-bound.
    loss = t * 4096 * 6 / H100.memory_bandwidth
    assert b["breakdown"]["compute"] == pytest.approx(2 * (3 * (2 * layer + head) + loss))
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
    # Across nodes the data-parallel all-reduce slows down (IB vs NVLink): a little when the
    # ring leaves each node over its 8 NICs (8 x 400 Gb/s against NVLink's 450 GB/s), 4x
    # and more when each member is alone in its node (tp=8: one NIC per ring).
    big = one(m, 16, 64, 4096, "dp=16 zero=0", StepOptions(overlap_dp=False))
    small = one(m, 8, 64, 4096, "dp=8 zero=0", StepOptions(overlap_dp=False))
    assert small["breakdown"]["dp_comm"] < big["breakdown"]["dp_comm"]
    wide = one(m, 16, 64, 4096, "dp=2 tp=8 zero=0", StepOptions(overlap_dp=False))
    narrow = one(m, 8, 64, 4096, "dp=2 tp=4 zero=0", StepOptions(overlap_dp=False))
    assert wide["breakdown"]["dp_comm"] > 4 * narrow["breakdown"]["dp_comm"] / 2


def test_efficiency_curve_rises_with_matmul_size() -> None:
    e = H100.efficiency
    sizes = np.array([64, 256, 1024, 4096, 16384])
    f = fraction_of_peak(matmul_intensity(sizes, sizes, sizes), e)
    assert (np.diff(f) > 0).all() and f[-1] < e.peak_fraction


@pytest.mark.parametrize("name", ["gpt2", "llama-3-8b", "qwen3-8b", "deepseek-v3-dense"])
def test_memory_bound_bytes_are_the_operator_tables(name: str) -> None:
    # Qwen3's query/key norms and latent attention's latent norms are priced as the table
    # lists them (DeepSeek-V3's attention on dense layers: the MLP widths then agree).
    m = (dataclasses.replace(get_model("deepseek-v3"), moe=None) if name.endswith("-dense")
         else get_model(name))
    one = np.array([1])
    elems, soft = layer_elementwise_elements(m, 512, one, np.array([2]), np.array([False]),
                                             flash=False)
    ops = layer_operators(m, H100, batch=2, q_len=512, kv_len=512, bytes_per=1)
    assert elems[0] == pytest.approx(sum(o.roofline.bytes for o in ops if o.kind != "matmul"))
    assert soft[0] == pytest.approx(2 * 2 * m.heads * 512 * 512)
    # Sequence parallelism splits the norms and adds too; a fused kernel has no softmax.
    t4 = np.array([4])
    sp, _ = layer_elementwise_elements(m, 512, t4, np.array([2]), np.array([True]), False)
    # (but latent attention's one shared rotary key, 2·T·rope, is on every rank whole)
    whole = 0 if m.mla is None else 2 * 1024 * m.mla.qk_rope_head_dim
    assert sp[0] == pytest.approx((elems[0] - whole) / 4 + whole)
    fused, none = layer_elementwise_elements(m, 512, one, np.array([2]), np.array([False]), True)
    assert none[0] == 0 and fused[0] == pytest.approx(elems[0] - soft[0])


# -- this machine: the measured runtime ---------------------------------------------------


def runtime() -> Runtime:
    over = {"ddp": Overhead(0.010, 0.001, 0.002, 0.001),
            "fsdp": Overhead(0.020, 0.005, 0.002, 0.010),
            "tp": Overhead(0.015, 0.001, 0.010, 0.030),
            "pp": Overhead(0.012, 0.001, 0.003, 0.002)}
    coll = {"all_reduce": (1e-4, 1e9), "all_gather": (3e-4, 4e8),
            "reduce_scatter": (3e-4, 3e8), "send": (4e-5, 5e9)}
    return Runtime(2, coll, over)


def cpu_with(rt: Runtime | None) -> Accelerator:
    link = Link("loopback", 7e9, 1.5e-4)
    return Accelerator(NAME, {"fp32": 2.6e11, "bf16": 1.5e12}, 24e9, 1.4e10, 0.0, link, link,
                       1, runtime=rt)


def on_cpu(rt: Runtime | None, text: str, options: StepOptions | None = None) -> dict:
    m = ModelShape("small", 4, 256, 4, vocab=156, context=128, style="llama", tied=False,
                   d_ff=1024)
    space = Space(gpus=2, global_batch=16, seq=128, gpus_per_node=1)
    return plan(m, cpu_with(rt), space, get_policy("fp32"), options=options,
                only=layout_candidates(m, space, text)).best[0]


@pytest.mark.parametrize("text, styles, layers, micro", [
    ("dp=2 zero=0 micro_batch=2", (), 4, 4),
    ("dp=2 zero=3 micro_batch=8", ("fsdp",), 4, 1),
    ("dp=1 tp=2 micro_batch=4", ("tp",), 4, 4),
    ("dp=1 pp=2 micro_batch=4 schedule=1f1b", ("pp",), 2, 4),
])
def test_overhead_is_the_base_plus_each_style_in_use(text: str, styles: tuple[str, ...],
                                                     layers: int, micro: int) -> None:
    rt = runtime()
    b = on_cpu(rt, text)
    base = rt.overheads["ddp"].seconds(micro, layers)
    want = base + sum(rt.overheads[s].seconds(micro, layers) - base for s in styles)
    assert b["breakdown"]["overhead"] == pytest.approx(want, rel=1e-12)
    assert sum(b["breakdown"][k] for k in PARTS) == pytest.approx(b["step_seconds"])


def test_without_a_runtime_there_is_no_overhead_and_the_link_prices_comm() -> None:
    text = "dp=2 zero=0 micro_batch=8"
    bare, measured = on_cpu(None, text), on_cpu(runtime(), text)
    assert bare["breakdown"]["overhead"] == 0 < measured["breakdown"]["overhead"]
    assert one(get_model("llama-3-8b"), 8, 64, 4096, "dp=8 zero=1")["breakdown"][
        "overhead"] == 0  # a catalog accelerator has no measured runtime


def test_collectives_take_gloo_rates_without_latency() -> None:
    # DDP's one gradient all-reduce, not overlapped: 2(p-1)/p x bytes at the all-reduce fit.
    rt = runtime()
    b = on_cpu(rt, "dp=2 zero=0 micro_batch=8", StepOptions(overlap_dp=False))
    grads = b["memory_breakdown"]["gradients"]
    assert b["breakdown"]["dp_comm"] == pytest.approx(grads / rt.collectives["all_reduce"][1])
    # ZeRO-3 gathers twice and reduce-scatters once, each at its own rate.
    z3 = on_cpu(rt, "dp=2 zero=3 micro_batch=8", StepOptions(overlap_dp=False))
    weights = 2 * z3["memory_breakdown"]["weights"]  # the gathered whole (ZeRO-3 holds half)
    want = 2 * 0.5 * weights / rt.collectives["all_gather"][1] + (
        0.5 * grads / rt.collectives["reduce_scatter"][1])
    assert z3["breakdown"]["dp_comm"] == pytest.approx(want, rel=1e-9)


def test_eager_gradient_accumulation_is_a_memory_pass_per_extra_micro_batch() -> None:
    text = "dp=2 zero=0 micro_batch=2"  # 4 micro-batches
    fused = on_cpu(None, text, StepOptions(overlap_dp=False))
    eager = on_cpu(None, text, StepOptions(overlap_dp=False, fused_accumulation=False))
    grads = fused["memory_breakdown"]["gradients"]
    extra = eager["breakdown"]["compute"] - fused["breakdown"]["compute"]
    assert extra == pytest.approx(3 * 3 * grads / (1.4e10 / 2), rel=1e-9)  # 2 ranks share


def test_the_measured_layer_gives_the_memory_bound_rate() -> None:
    # A layer whose memory-bound operators took exactly 2 GB/s on top of the model's
    # matmul and attention time gives back 2 GB/s.
    dev, _ = device_of(cpu_with(None), get_policy("fp32"), 2)
    probe = {"batch": 8.0, "seq": 128.0, "d_model": 256.0, "heads": 4.0, "d_ff": 1024.0}
    shape = ModelShape("probe", 1, 256, 4, vocab=16, context=128, style="llama", tied=False,
                       d_ff=1024)
    one = np.ones(1, dtype=np.int64)
    layer = layer_forward(shape, 128, one, one * 8, dev, moe_layer=False)
    mat, core = layer.matmul, layer.core
    elements, _ = layer_elementwise_elements(shape, 128, one, one * 8, np.zeros(1, bool), True)
    ew_bytes = 3 * float(elements[0]) * 4
    probe["seconds"] = 3 * float((mat + core)[0]) + ew_bytes / 2e9
    assert probe_elementwise_bandwidth(probe, dev) == pytest.approx(2e9, rel=1e-9)
    probe["seconds"] = 0.5 * float((mat + core)[0])  # faster than its matmuls: no figure
    assert probe_elementwise_bandwidth(probe, dev) is None


@pytest.mark.parametrize("each", [False, True])
def test_fsdp1_backward_post_leaves_the_backward_gathers_waiting(each: bool) -> None:
    # Llama 3 8B on 128 H100s, FSDP, 4 micro-batches: with BACKWARD_PRE every gather hides
    # (but the last unit's share); with BACKWARD_POST the backward's gathers are exposed,
    # so the step grows by what they hid and the communication moved is the same.
    m, text = get_model("llama-3-8b"), "dp=128 zero=3 micro_batch=1 recompute=full"
    pre = one(m, 128, 512, 4096, text, StepOptions(reduce_each_micro=each))
    post = one(m, 128, 512, 4096, text, StepOptions(reduce_each_micro=each,
                                                    backward_prefetch="post"))
    total = pre["breakdown"]["dp_comm"] + pre["hidden"]["dp_comm"]
    assert post["breakdown"]["dp_comm"] + post["hidden"]["dp_comm"] == pytest.approx(total)
    assert post["breakdown"]["dp_comm"] > 2 * pre["breakdown"]["dp_comm"] > 0
    grown = post["step_seconds"] - pre["step_seconds"]
    assert grown == pytest.approx(post["breakdown"]["dp_comm"] - pre["breakdown"]["dp_comm"])
    with pytest.raises(SpecError, match="backward_prefetch='never': must be one of pre, post"):
        StepOptions(backward_prefetch="never")
