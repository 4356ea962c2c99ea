"""The causal-LM loss: 16-bit logits go into the cross entropy as fp32 (in bf16 every
token's loss and their sum would keep 8 mantissa bits); fp32 and fp64 stay as they are."""

from __future__ import annotations

import torch

from shardlab.nn.loss import lm_loss_sum


def test_bf16_logits_give_the_fp32_loss_of_the_same_values() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 64, 300).bfloat16()
    targets = torch.randint(0, 300, (2, 64))
    mask = torch.ones(2, 64)
    mask[1, 40:] = 0
    got = lm_loss_sum(logits, targets, mask)
    want = lm_loss_sum(logits.float(), targets, mask)  # the same bf16 values, in fp32
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # In bf16 the sum would round to bf16's 8 bits: a different number than the fp32 one.
    rounded = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                                reduction="none")
    in_bf16 = (rounded * mask.flatten().bfloat16()).sum()
    assert in_bf16.dtype == torch.bfloat16 and float(in_bf16) != float(got)


def test_fp64_logits_stay_fp64() -> None:
    logits = torch.randn(1, 8, 16, dtype=torch.float64)
    loss = lm_loss_sum(logits, torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8))
    assert loss.dtype == torch.float64
