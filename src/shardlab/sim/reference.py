"""One device training the same model on the same batches: what every layout must equal."""

from __future__ import annotations

import torch

from shardlab.nn.data import Batch
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import TransformerLM
from shardlab.sim.engine import DEFAULT_ADAMW, AdamWConfig


class Reference:
    """TransformerLM + AdamW on whole global batches, loss summed over real tokens and
    divided by their number."""

    def __init__(self, model: TransformerLM, opt: AdamWConfig = DEFAULT_ADAMW) -> None:
        self.model = model
        self.optimizer = opt.make(list(model.parameters()))

    def step(self, batch: Batch) -> float:
        """One optimizer step on ``batch``; returns its loss."""
        logits = self.model(batch.input_ids, batch.pad_mask)
        loss = lm_loss_sum(logits, batch.targets, batch.loss_mask) / batch.real_tokens
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def params(self) -> dict[str, torch.Tensor]:
        """Named parameters (a tied head appears once, as ``embed.weight``)."""
        return {n: p.detach() for n, p in self.model.named_parameters()}
