"""What a framework's implementation adds to the step: torchtitan's per-operator
recompute, the loss over the vocabulary, FSDP's reduce-scatter in every micro-batch."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.plan.layer_time import layer_forward
from shardlab.plan.memory_bound import layer_elementwise_elements
from shardlab.plan.search import device_of, layout_candidates, plan
from shardlab.plan.space import Space
from shardlab.plan.step_time import StepOptions

H100 = get_accelerator("H100 SXM")
BF16 = get_policy("bf16")
M = get_model("llama-3-8b")


def one(gpus: int, batch: int, text: str, options: StepOptions) -> dict:
    space = Space(gpus=gpus, global_batch=batch, seq=4096)
    return plan(M, H100, space, BF16, only=layout_candidates(M, space, text),
                options=options).best[0]


def test_per_operator_recompute_is_every_second_matmul_and_the_memory_bound_ops() -> None:
    text = "dp=8 zero=1 micro_batch=1 recompute="
    none = one(8, 16, text + "none", StepOptions())
    op = one(8, 16, text + "selective", StepOptions(selective="op"))
    attention = one(8, 16, text + "selective", StepOptions())
    full = one(8, 16, text + "full", StepOptions())
    assert none["breakdown"]["recompute"] < op["breakdown"]["recompute"] < full[
        "breakdown"]["recompute"]
    assert op["breakdown"]["recompute"] != pytest.approx(attention["breakdown"]["recompute"])
    # Beyond the fused kernel's half core (none's), per layer and micro-batch: the k,
    # output and up matmuls and the layer's memory-bound operators, once more.
    dev, _ = device_of(H100, BF16, 8)
    one_ = np.array([1])
    redo = layer_forward(M, 4096, one_, one_, dev, moe_layer=False).op_recompute[0]
    elems, _ = layer_elementwise_elements(M, 4096, one_, one_, np.array([False]), True)
    per_layer = redo + float(elems[0]) * 2 / H100.memory_bandwidth
    extra = op["breakdown"]["recompute"] - none["breakdown"]["recompute"]
    assert extra == pytest.approx(2 * M.layers * per_layer, rel=1e-9)  # 2 micro-batches


def test_per_operator_recompute_gathers_the_inputs_again_under_sequence_parallel() -> None:
    text = "dp=4 tp=2 sp=1 zero=1 micro_batch=1 recompute=selective"
    op = one(8, 8, text, StepOptions(selective="op"))
    attention = one(8, 8, text, StepOptions())
    # Two all-gathers of T·h bf16 activations over NVLink (80% of 450 GB/s), each
    # (p-1)·5 µs + (p-1)/p·n/B, per layer of the 2 micro-batches.
    n = 4096 * M.d_model * 2
    gather = 5e-6 + 0.5 * n / (0.8 * 450e9)
    extra = op["breakdown"]["tp_comm"] - attention["breakdown"]["tp_comm"]
    assert extra == pytest.approx(2 * M.layers * 2 * gather, rel=1e-9)


def test_the_loss_moves_its_bytes_per_logit_on_the_last_stage() -> None:
    text = "dp=8 zero=1 micro_batch=1"
    fused = one(8, 16, text, StepOptions(loss_bytes=6))
    megatron = one(8, 16, text, StepOptions(loss_bytes=52))
    extra = megatron["breakdown"]["compute"] - fused["breakdown"]["compute"]
    assert extra == pytest.approx(2 * 4096 * M.vocab * 46 / H100.memory_bandwidth, rel=1e-9)


def test_fsdp_without_no_sync_reduce_scatters_in_every_micro_batch() -> None:
    # ZeRO-3 on one node, 4 micro-batches, nothing overlapped: three more reduce-scatters of
    # the bf16 gradients (each (p-1)·5 µs per layer and once more, plus (p-1)/p·n/B).
    text = "dp=8 zero=3 micro_batch=1"
    kw = {"overlap_dp": False, "grad_reduce_bytes": 0}
    once = one(8, 32, text, StepOptions(**kw))
    each = one(8, 32, text, StepOptions(reduce_each_micro=True, **kw))
    n = 8 * once["memory_breakdown"]["gradients"]  # the whole model's gradients
    rs = (M.layers + 1) * 7 * 5e-6 + 7 / 8 * n / (0.8 * 450e9)
    extra = each["breakdown"]["dp_comm"] - once["breakdown"]["dp_comm"]
    assert extra == pytest.approx(3 * rs, rel=1e-6)


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp_in_pipeline_stages_gathers_once_and_reduces_after_the_last_backward(
        zero: int) -> None:
    # torch.distributed.pipelining keeps a stage's FSDP units gathered across its
    # micro-batches and reduce-scatters once, after its last backward (stage.py
    # perform_reduce_grad): one gather and one reduce-scatter a step, whatever the count.
    piped = f"dp=4 pp=2 zero={zero} micro_batch=1"
    kw = {"grad_reduce_bytes": 0, "reduce_each_micro": True}

    def dp(batch: int, overlap: bool) -> tuple[float, float]:
        e = one(8, batch, piped, StepOptions(overlap_dp=overlap, **kw))
        return e["breakdown"]["dp_comm"], e["hidden"].get("dp_comm", 0.0)

    off8, _ = dp(32, False)  # 8 micro-batches
    assert dp(64, False)[0] == pytest.approx(off8, rel=1e-12)  # 16: the same two rings
    # bf16 gradients and weights: the gather and the reduce-scatter move the same bytes
    # over the same ring, so each is half; overlapped, only the gather hides (behind the
    # first forward), the reduce-scatter waits in full.
    on, hidden = dp(32, True)
    assert on + hidden == pytest.approx(off8, rel=1e-12)
    assert on >= off8 / 2 * (1 - 1e-12) and hidden > 0
    # ZeRO-3 without the pipeline runtime's order (Megatron-style, reduce once) gathers in
    # every micro-batch's forward and backward: 2 x 8 gathers and one reduce-scatter.
    megatron = one(8, 32, "dp=4 pp=2 zero=3 micro_batch=1",
                   StepOptions(overlap_dp=False, grad_reduce_bytes=0))["breakdown"]["dp_comm"]
    assert megatron == pytest.approx(off8 / 2 * 17, rel=1e-12)
