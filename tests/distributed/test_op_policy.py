"""``recompute=op``: torchtitan's per-operator checkpointing policy on shardlab's blocks
keeps what :func:`shardlab.estimate.activations.op_checkpoint_layer_bytes` counts, as
:func:`shardlab.distributed.saved.saved_activation_bytes` measures it (the blocks' inputs
through autograd's hooks, the policy's cache beside them), for a Llama block with
grouped-query attention, a gpt block (every linear biased: ``addmm``, saved and not
counted) and a Qwen2-style block (q, k and v biased); gradients equal the run without
checkpointing; a mixture of experts is refused."""

from __future__ import annotations

import pytest
import torch

from shardlab.config.model import ModelShape, MoE
from shardlab.distributed.activation_checkpoint import apply_ac
from shardlab.distributed.op_policy import op_policy, saved_ops
from shardlab.distributed.saved import saved_activation_bytes
from shardlab.errors import SpecError
from shardlab.estimate.activations import op_checkpoint_layer_bytes, op_checkpoint_saves
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import TransformerLM

LLAMA = ModelShape("llama", 2, 64, 4, vocab=96, context=32, style="llama", tied=False,
                   d_ff=160, kv_heads=2)
GPT = ModelShape("gpt", 2, 64, 4, vocab=96, context=32, style="gpt", tied=False)
QWEN = ModelShape("qwen", 2, 64, 4, vocab=96, context=32, style="llama", tied=False,
                  d_ff=160, kv_heads=2, qkv_bias=True)
BATCH, SEQ = 2, 32


def test_which_matmul_outputs_are_kept() -> None:
    # q, v, gate, down (SwiGLU); every biased linear (gpt); q, k, v biased: o, up kept.
    assert op_checkpoint_saves(LLAMA) == (True, False, True, False, True, False, True)
    assert op_checkpoint_saves(GPT) == (True,) * 6
    assert op_checkpoint_saves(QWEN) == (True, True, True, True, False, True, False)


@pytest.mark.parametrize("shape", [LLAMA, GPT, QWEN], ids=lambda s: s.name)
def test_a_block_keeps_what_the_count_says(shape: ModelShape) -> None:
    """fp32: the measured bytes of the policy's cache and the checkpoints' inputs, less
    the model's tensors outside the blocks (measured on the same model without them),
    within 0.5% of the count per layer."""
    ids = torch.randint(0, shape.vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))

    def kept(blocks: int) -> int:
        model = TransformerLM(shape)
        model.blocks = model.blocks[:blocks]
        return saved_activation_bytes(lambda: apply_ac(model, "op")(ids))[1]

    per_layer = (kept(2) - kept(0)) / 2
    # The blocks' first input is the embedding's output, kept by the model anyway; each
    # later block's input is the previous block's output: one layer_input per layer.
    counted = op_checkpoint_layer_bytes(shape, BATCH, SEQ, 4)
    assert per_layer == pytest.approx(counted, rel=5e-3)


def test_gradients_match_and_the_count_restarts_each_call() -> None:
    """Two forwards (a fresh count each), one backward: the policy's gradients equal
    the run without checkpointing to fp32 rounding (atol 1e-6)."""
    ids = torch.randint(0, LLAMA.vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    targets, weights = ids.roll(-1, 1), torch.ones(BATCH, SEQ)

    def grads(mode: str) -> list[torch.Tensor]:
        model = apply_ac(TransformerLM(LLAMA, seed=3), mode)
        loss = sum(lm_loss_sum(model(ids), targets, weights) for _ in range(2))
        loss.backward()  # type: ignore[union-attr]
        return [p.grad for p in model.parameters() if p.grad is not None]

    for got, want in zip(grads("op"), grads("none"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_policy_saves_odd_matmuls_and_the_kernels() -> None:
    class Ctx:
        is_recompute = False

    policy, mm = op_policy(), torch.ops.aten.mm.default
    decisions = [policy(Ctx(), mm).name for _ in range(4)]
    assert decisions == ["MUST_SAVE", "PREFER_RECOMPUTE"] * 2
    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert attention in saved_ops() and torch.ops.aten.addmm.default in saved_ops()
    assert policy(Ctx(), attention).name == "MUST_SAVE"
    assert policy(Ctx(), torch.ops.aten.silu.default).name == "PREFER_RECOMPUTE"


def test_a_mixture_of_experts_is_refused() -> None:
    moe = ModelShape("moe", 2, 64, 4, vocab=96, context=32, style="llama", tied=False,
                     d_ff=160, moe=MoE(experts=4, experts_per_token=2, expert_d_ff=32))
    with pytest.raises(SpecError, match="recompute='op': is built for dense blocks only"):
        apply_ac(TransformerLM(moe), "op")
