"""The parity reference: the run's model, data, optimizer and clipping on one process.

``shardlab train --check-parity`` compares every layout's loss curve with this one
(:func:`reference_run`); the ranks' loop is :mod:`shardlab.train.loop`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from shardlab.distributed.pipeline import masked_targets
from shardlab.nn.data import batches
from shardlab.nn.model import TransformerLM
from shardlab.train.config import TrainConfig
from shardlab.train.loop import load_initial_weights
from shardlab.train.optimizer import clip_grad_norm, make_optimizer
from shardlab.train.rank import bf16_autocast


def token_loss_sum(logits: Any, batch: Any) -> Any:
    """Summed next-token cross-entropy over real tokens (padding targets ignored); works on
    a vocabulary-sharded DTensor under ``loss_parallel``."""
    return F.cross_entropy(logits.flatten(0, 1), masked_targets(batch).flatten(),
                           ignore_index=-100, reduction="sum")


def reference_run(cfg: TrainConfig) -> list[float]:
    """The same model, data, optimizer and clipping on one process: the parity reference."""
    torch.manual_seed(cfg.seed)
    model = TransformerLM(cfg.shape, seed=cfg.seed)
    if cfg.init_from:
        load_initial_weights(model, cfg.init_from)
    opt, sched = make_optimizer(list(model.parameters()), cfg)
    stream = batches(cfg.docs, cfg.global_batch, cfg.seq, seed=cfg.seed)
    losses = []
    for _ in range(cfg.steps):
        batch = next(stream)
        with bf16_autocast(cfg):
            loss = token_loss_sum(model(batch.input_ids, batch.pad_mask), batch)
        (loss / batch.real_tokens).backward()
        clip_grad_norm(list(model.parameters()), cfg.clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()) / batch.real_tokens)
    return losses
