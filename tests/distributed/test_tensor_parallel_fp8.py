"""torchao's float8 tensor-parallel styles in the plan: a float8 linear gets its float8
column or row style, and an input is cast before its sequence all-gather only where every
linear reading it is a float8 one."""

from __future__ import annotations

import pytest

from shardlab.config.model import ModelShape
from shardlab.distributed.tensor_parallel import block_plan, float8_styles, tp_plan

SHAPE = ModelShape("t", 2, 64, 8, 512, 64, kv_heads=4, d_ff=128, style="llama", tied=False)
EVERY = frozenset({"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})


@pytest.fixture(scope="module")
def styles() -> tuple[type, type, type]:
    from shardlab.train.fp8 import _float8

    _float8()  # torchao imported quietly
    return float8_styles()


def test_every_linear_in_fp8_gathers_both_inputs_in_fp8(styles: tuple[type, type, type]
                                                        ) -> None:
    col, row, prepare = styles
    plan = block_plan(SHAPE, sequence_parallel=True, fp8=EVERY)
    for name in EVERY:
        assert type(plan[name]) is (row if name in ("attn.o_proj", "mlp.down_proj") else col)
    assert type(plan["attn"]) is prepare and type(plan["mlp"]) is prepare


def test_an_input_a_bf16_linear_reads_is_gathered_in_bf16(styles: tuple[type, type, type]
                                                          ) -> None:
    col, _, prepare = styles
    plan = block_plan(SHAPE, sequence_parallel=True,
                      fp8=EVERY - {"attn.k_proj", "attn.v_proj"})
    assert type(plan["attn.q_proj"]) is col and type(plan["attn.k_proj"]) is not col
    assert type(plan["attn"]) is not prepare and type(plan["mlp"]) is prepare


def test_without_fp8_the_plan_is_torchs_own() -> None:
    plan = tp_plan(SHAPE, sequence_parallel=True)
    assert all(k.startswith("blocks.*.") or "." not in k or k.startswith("blocks.0")
               for k in plan)
    assert all(type(v).__module__.startswith("torch.distributed") for v in plan.values())
    named = tp_plan(SHAPE, sequence_parallel=True, fp8={0: EVERY, 1: EVERY})
    assert "blocks.1.attn.q_proj" in named and "blocks.*.attn.q_proj" not in named
