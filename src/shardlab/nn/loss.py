"""The causal-LM loss, summed over real tokens, so any split of a batch sums to the same.

Dividing by the number of real tokens in the *whole global batch* (not averaging the
per-device or per-micro-batch means) makes data-parallel and micro-batched training
equal one device on the whole batch when documents have different lengths (seed 002's
point; the mean of local means weights short documents too much).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def loss_logits(logits: torch.Tensor) -> torch.Tensor:
    """The logits as the cross entropy takes them: 16-bit ones upcast to fp32 (torchtitan
    and Megatron do the same; in bf16 each token's loss, and their sum, would keep 8
    mantissa bits), fp32 and fp64 as they are. A DTensor stays one."""
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits


def lm_loss_sum(logits: torch.Tensor, targets: torch.Tensor,
                loss_mask: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over positions where ``loss_mask`` is 1.

    logits [b, s, V], targets [b, s] (already shifted), loss_mask [b, s] of 0/1.
    """
    flat = loss_logits(logits.reshape(-1, logits.shape[-1]))
    per_token = F.cross_entropy(flat, targets.reshape(-1), reduction="none")
    return (per_token * loss_mask.reshape(-1).to(per_token.dtype)).sum()
