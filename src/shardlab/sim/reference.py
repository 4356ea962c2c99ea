"""One device training the same model on the same batches: what every layout must equal."""

from __future__ import annotations

import torch

from shardlab.nn.data import Batch
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import TransformerLM
from shardlab.sim.parallel import DEFAULT_ADAMW, AdamWConfig


class Reference:
    """TransformerLM + AdamW on whole global batches, loss summed over real tokens and
    divided by their number.

    ``groups`` > 1 runs each global batch as that many consecutive equal micro-batches
    with accumulated gradients: for a MoE model, the dp x m micro-batches the replicas
    run (``Batch.split(dp)`` then ``split(m)``). The objective is the same sum over
    tokens, but a MoE layer's auxiliary losses and its capacity are functions of the
    tokens of one forward (Switch, GShard: per group of tokens), so one device must see
    the same groups as the devices do to train the same model.
    """

    def __init__(self, model: TransformerLM, opt: AdamWConfig = DEFAULT_ADAMW,
                 groups: int = 1) -> None:
        self.model = model
        self.groups = groups
        self.optimizer = opt.make(list(model.parameters()))

    def step(self, batch: Batch) -> float:
        """One optimizer step on ``batch``; returns its loss."""
        loss = 0.0
        for part in batch.split(self.groups):
            logits = self.model(part.input_ids, part.pad_mask)
            part_loss = lm_loss_sum(logits, part.targets, part.loss_mask) / batch.real_tokens
            part_loss.backward()
            loss += float(part_loss.detach())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def params(self) -> dict[str, torch.Tensor]:
        """Named parameters (a tied head appears once, as ``embed.weight``)."""
        return {n: p.detach() for n, p in self.model.named_parameters()}
