"""The overlap formulas of the step-time model, by hand, and the frameworks' defaults."""

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.hardware import get_accelerator
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.plan.options import step_options_for, te_falls_back
from shardlab.plan.overlap import (
    FRAMEWORKS,
    dp_on,
    framework,
    hidden_behind,
    mode,
    pp_exposed,
    pp_on,
    pp_unhidden,
    tp_exposed,
)
from shardlab.plan.search import layout_step_keys
from shardlab.plan.step_time import StepOptions


def test_hidden_behind_keeps_one_unit_and_the_excess_exposed() -> None:
    comm, window, units = np.array([8.0, 8.0, 8.0]), np.array([2.0, 10.0, 10.0]), 4.0
    on = np.array([True, True, False])
    # 8 s behind 2 s: 6 exposed; behind 10 s: the last of 4 units (2 s); off: all 8.
    assert hidden_behind(comm, window, np.full(3, units), on).tolist() == [6.0, 2.0, 8.0]


def test_tp_overlap_hides_all_but_the_first_chunk_s_share() -> None:
    t = np.array([8.0])
    comm, gemm = np.array([1.0]), np.array([1.0])
    assert tp_exposed(comm, comm, gemm, t, "off") == pytest.approx(2.0)
    # Forward: 1 - 7/8 = 1/8 exposed; backward hides behind 2 x 7/8 entirely.
    assert tp_exposed(comm, comm, gemm, t, "on") == pytest.approx(0.125)
    # torch async TP: the forward only.
    assert tp_exposed(comm, comm, gemm, t, "forward") == pytest.approx(1.125)


def test_pp_overlap_leaves_the_first_and_last_message() -> None:
    msg, n = np.array([0.1, 0.5]), np.array([16.0, 16.0])
    chunk = np.array([0.3, 0.3])
    shape = (np.array([4, 4]), np.array([2, 2]), np.array([4, 4]))  # pp, v, m
    exposed = pp_exposed(msg, n, chunk, "on", *shape)
    # 2 messages exposed; the other 14 each exceed 0.3 s of chunk by 0 and 0.2 s.
    assert exposed.tolist() == pytest.approx([0.2, 1.0 + 14 * 0.2])
    assert pp_exposed(msg, n, chunk, "off", *shape).tolist() == pytest.approx([1.6, 8.0])


def test_megatron_leaves_the_warmup_and_flush_messages_exposed() -> None:
    # Megatron-Core's first-stage warmup, min((p-1)·2 + (v-1)·p, m·v), and as many flush
    # messages; m = p makes every chunk warmup.
    p, v, m = np.array([8, 8, 4, 4]), np.array([8, 2, 2, 1]), np.array([16, 64, 4, 16])
    assert pp_unhidden("interleaved", p, v, m).tolist() == [2 * 70, 2 * 22, 2 * 8, 2 * 6]
    assert pp_unhidden("on", p, v, m).tolist() == [2.0] * 4
    msg, chunk = np.full(4, 0.1), np.full(4, 1.0)
    n = 2.0 * v * m
    got = pp_exposed(msg, n, chunk, "interleaved", p, v, m)
    # v = 1: Megatron's overlap is for interleaved schedules only, so all of them.
    assert got.tolist() == pytest.approx([14.0, 4.4, 1.6, 3.2])
    assert pp_on("interleaved", v).tolist() == [True, True, True, False]


def test_modes_that_depend_on_the_layout() -> None:
    assert dp_on("zero3", np.array([0, 2, 3])).tolist() == [False, False, True]
    assert pp_on("interleaved", np.array([1, 2])).tolist() == [False, True]
    assert StepOptions(overlap_dp=True, overlap_tp=False).overlap_dp == "on"
    assert mode("overlap_pp", "1", ("off", "on")) == "on"
    with pytest.raises(SpecError, match="overlap_tp"):
        StepOptions(overlap_tp="sometimes")


def test_frameworks_are_known_and_sourced() -> None:
    assert set(FRAMEWORKS) == {"megatron", "torchtitan", "fsdp", "deepspeed"}
    for f in FRAMEWORKS.values():
        assert f.source and f.overlap_dp in ("off", "on", "zero3")
    assert framework("Megatron").name == "megatron" and framework(None).name == "none"
    with pytest.raises(SpecError, match="megatron, torchtitan, fsdp, deepspeed"):
        framework("jax")


def test_a_run_s_kernel_and_reduce_dtype_override_the_framework() -> None:
    h100 = get_accelerator("H100 SXM")
    keys = layout_step_keys("dp=8 flash_kernel=Triton reduce_dtype=bf16")
    opts = step_options_for(h100, flash=True, framework="fsdp", overrides=keys)
    assert (opts.flash_kernel, opts.grad_reduce_bytes) == ("triton", 2)
    plain = step_options_for(h100, flash=True, framework="fsdp")
    assert (plain.flash_kernel, plain.grad_reduce_bytes) == ("fa2", 4)
    with pytest.raises(SpecError, match=r"flash_kernel.*fa2, fa3, triton, fa1, fp8$"):
        step_options_for(h100, flash=True, overrides={"flash_kernel": "fa9"})
    with pytest.raises(SpecError, match=r"reduce_dtype.*bf16, fp32"):
        step_options_for(h100, flash=True, overrides={"reduce_dtype": "fp16"})


def test_megatron_on_blackwell_runs_flash_attention_2_above_head_dim_128() -> None:
    # Transformer Engine's cuDNN attention trains on sm100 at head dims <= 128, 192/128
    # (latent attention) and 256/256 only; above 128 otherwise TE takes FlashAttention-2.
    wide = ModelShape("hd192", 4, 6144, 32, vocab=32000, context=4096, kv_heads=8)
    narrow = get_model("llama-3-8b")
    hd256 = ModelShape("hd256", 4, 4096, 16, vocab=32000, context=4096)
    gb200, h100 = get_accelerator("GB200"), get_accelerator("H100 SXM")
    assert (wide.head_dim, narrow.head_dim, hd256.head_dim) == (192, 128, 256)

    def kernel(model: ModelShape, acc: object, fw: str = "megatron",
               keys: dict[str, str] | None = None) -> str:
        return step_options_for(acc, flash=True, framework=fw, overrides=keys,  # type: ignore[arg-type]
                                model=model).flash_kernel

    assert te_falls_back(wide, gb200) and te_falls_back(wide, get_accelerator("B200"))
    assert kernel(wide, gb200) == "fa2"
    # cuDNN's kernel: head dim 128, 256/256, latent attention (192/128), on Hopper, and
    # wherever a run names its kernel or no model is given.
    assert kernel(narrow, gb200) == kernel(hd256, gb200) == "fa3"
    assert kernel(get_model("deepseek-v3"), gb200) == "fa3"
    assert kernel(wide, h100) == "fa3"
    assert kernel(wide, gb200, keys={"flash_kernel": "fa3"}) == "fa3"
    assert step_options_for(gb200, flash=True, framework="megatron").flash_kernel == "fa3"
    # Other stacks keep their own kernel (torch SDPA's FlashAttention-2 in torchtitan).
    assert kernel(wide, gb200, fw="torchtitan") == "fa2"
    assert kernel(narrow, gb200, fw="torchtitan") == "fa2"
