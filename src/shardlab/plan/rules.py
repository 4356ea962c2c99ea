"""The rules a layout must keep before it is priced: each broken rule is a reason the
search reports (``rejected``), in :data:`REASONS`' order; the first one broken is the one
named. They are :func:`~shardlab.config.layout.make_layout`'s checks (and, for a search
of this machine, ``shardlab train``'s), vectorised over the candidates."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shardlab.config.layout import SCHEDULES
from shardlab.config.model import ModelShape

if TYPE_CHECKING:  # the space calls these rules: types only, no import cycle
    from shardlab.plan.space import Candidates, Space

R_TP = "tp does not divide heads, kv heads or d_ff"
R_EP = "ep does not divide dp (tp·cp·dp/etp folded) or the experts"
R_CHUNKS = "pp x virtual stages exceeds the layers"
R_BATCH = "global batch not a multiple of dp x micro-batch"
R_CP = "cp does not cut seq into 2 x cp equal chunks"
R_SP = "seq / cp not divisible by tp (sequence parallel)"
R_HSDP = "dp_replicate > 1 (HSDP) needs ZeRO >= 1"
R_INTERLEAVED = "interleaved-1f1b needs micro-batches in multiples of pp"
R_DUALPIPE = "dualpipev needs at least 2 x pp micro-batches"
R_TRAIN = "not supported by shardlab train"
R_PIPE_ZERO = "ZeRO above what the framework pipelines (DeepSpeed: 0-1)"
R_OFFLOAD = "offload_layers needs pp 1 and no recompute (Megatron-Core)"
R_MEMORY = "out of memory"
REASONS: tuple[str, ...] = (R_TP, R_EP, R_CHUNKS, R_BATCH, R_CP, R_SP, R_HSDP, R_INTERLEAVED,
                            R_DUALPIPE, R_TRAIN, R_PIPE_ZERO, R_OFFLOAD, R_MEMORY)


def _mark(c: Candidates, bad: np.ndarray, reason: str) -> None:
    c.reason[(c.reason < 0) & bad] = REASONS.index(reason)


def check_rules(model: ModelShape, sp: Space, c: Candidates) -> None:
    """Set ``c.reason`` for every layout that :func:`make_layout` (or train) would refuse."""
    bad_tp = (model.heads % c.tp != 0) | (model.kv_heads % c.tp != 0) | (model.d_ff % c.tp != 0)
    if model.moe is not None:
        bad_tp |= (c.etp > 1) & (model.moe.expert_d_ff % c.tp != 0)
    _mark(c, bad_tp, R_TP)
    experts = model.moe.experts if model.moe is not None else 1
    _mark(c, (c.dp * c.expert_fold_ranks % c.ep != 0) | (experts % c.ep != 0), R_EP)
    _mark(c, c.pp * c.virtual > model.layers, R_CHUNKS)
    _mark(c, sp.global_batch % (c.dp * c.micro_batch) != 0, R_BATCH)
    _mark(c, (c.cp > 1) & (sp.seq % (2 * c.cp) != 0), R_CP)
    _mark(c, c.sp & ((sp.seq % c.cp != 0) | ((sp.seq // c.cp) % c.tp != 0)), R_SP)
    _mark(c, (c.dp_replicate > 1) & (c.zero == 0), R_HSDP)
    inter = c.schedule == SCHEDULES.index("interleaved-1f1b")
    _mark(c, inter & (c.microbatches % c.pp != 0), R_INTERLEAVED)
    _mark(c, (c.schedule == SCHEDULES.index("dualpipev")) & (c.microbatches < 2 * c.pp),
          R_DUALPIPE)
    if sp.train_only:
        # shardlab train (train.config.check_config): no tied head split over stages with
        # tp > 1; DDP holds no DTensors and runs in no pipeline; torch's 1F1B needs at
        # least pp micro-batches.
        bad = (c.tp > 1) & (c.pp > 1) & model.tied
        bad |= (c.zero == 0) & (c.dp > 1) & ((c.tp > 1) | (c.pp > 1))
        bad |= (c.pp > 1) & (c.schedule == SCHEDULES.index("1f1b")) & (c.microbatches < c.pp)
        if model.moe is not None:
            bad |= c.etp != 1  # train builds whole experts on every tp rank (etp = 1)
        if model.moe is not None:  # train: an ep group inside one HSDP replica
            bad |= (c.dp // c.dp_replicate) % c.ep != 0
        bad |= (c.dp_replicate > 1) & (c.zero == 0)  # HSDP is FSDP2's: not with DDP
        _mark(c, bad, R_TRAIN)
    if sp.pipeline_max_zero is not None:
        _mark(c, (c.pp > 1) & (c.zero > sp.pipeline_max_zero), R_PIPE_ZERO)
