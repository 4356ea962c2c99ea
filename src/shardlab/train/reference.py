"""The parity reference: the run's model, data, optimizer and clipping on one process.

``shardlab train --check-parity`` compares every layout's loss curve with this one
(:func:`reference_run`); the ranks' loop is :mod:`shardlab.train.loop`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from shardlab.distributed.pipeline import masked_targets
from shardlab.nn.data import Batch, batches
from shardlab.nn.model import TransformerLM
from shardlab.train.config import TrainConfig
from shardlab.train.fp8 import convert_fp8_linears
from shardlab.train.loop import load_initial_weights
from shardlab.train.optimizer import clip_grad_norm, make_optimizer
from shardlab.train.rank import bf16_autocast, moe_options


def token_loss_sum(logits: Any, batch: Any) -> Any:
    """Summed next-token cross-entropy over real tokens (padding targets ignored); works on
    a vocabulary-sharded DTensor under ``loss_parallel``."""
    return F.cross_entropy(logits.flatten(0, 1), masked_targets(batch).flatten(),
                           ignore_index=-100, reduction="sum")


def token_groups(cfg: TrainConfig, batch: Batch) -> list[Batch]:
    """The token groups one step's forwards see in the distributed run: the whole batch for
    a dense model; for a mixture of experts every data-parallel rank's micro-batches
    (rank-major), because a MoE layer's auxiliary losses and capacity are computed per
    forward on the tokens that forward routes (per rank and micro-batch, as GShard and
    Megatron-LM compute them), so the reference must route the same groups to be equal."""
    if cfg.shape.moe is None:
        return [batch]
    return [mb for share in batch.split(cfg.dp) for mb in share.split(cfg.microbatches)]


def reference_run(cfg: TrainConfig) -> list[float]:
    """The same model, data, optimizer and clipping on one process: the parity reference.

    A mixture-of-experts model runs one forward per token group of the distributed run
    (:func:`token_groups`) with the auxiliary losses weighted 1/groups
    (:func:`shardlab.train.rank.moe_options`): the same objective, group for group."""
    torch.manual_seed(cfg.seed)
    groups = cfg.dp * cfg.microbatches if cfg.shape.moe is not None else 1
    model = TransformerLM(cfg.shape, seed=cfg.seed, moe_options=moe_options(cfg, groups))
    if cfg.init_from:
        load_initial_weights(model, cfg.init_from)
    if cfg.dtype == "fp8":
        convert_fp8_linears(model)
    opt, sched = make_optimizer(list(model.parameters()), cfg)
    stream = batches(cfg.docs, cfg.global_batch, cfg.seq, seed=cfg.seed)
    losses = []
    for _ in range(cfg.steps):
        batch = next(stream)
        total = 0.0
        for part in token_groups(cfg, batch):
            with bf16_autocast(cfg, "cpu"):  # the reference runs in this process, on its CPU
                loss = token_loss_sum(model(part.input_ids, part.pad_mask), part)
            (loss / batch.real_tokens).backward()
            total += float(loss.detach())
        clip_grad_norm(list(model.parameters()), cfg.clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / batch.real_tokens)
    return losses
