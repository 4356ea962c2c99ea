"""The one-process parity reference of a mixture of experts sees the distributed run's
token groups: one forward per data-parallel rank and micro-batch, rank-major, with the
auxiliary losses weighted 1/groups (a dense model: the whole batch at once)."""

from __future__ import annotations

import dataclasses

from shardlab.config.model import ModelShape, MoE
from shardlab.nn.data import batches
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.train.config import TrainConfig
from shardlab.train.rank import moe_options
from shardlab.train.reference import token_groups

DENSE = ModelShape("tiny", 2, 32, 4, garden_vocab().size, 16, style="llama", tied=False)
MOE = dataclasses.replace(DENSE, moe=MoE(8, 2, 16))


def test_token_groups_follow_the_ranks_micro_batches() -> None:
    batch = next(batches(garden_documents(50, 0), 8, 16, seed=0))
    cfg = TrainConfig(shape=MOE, dp=2, ep=2, micro_batch=2, aux_coef=0.01, z_coef=0.002)
    groups = token_groups(cfg, batch)
    assert [g.size for g in groups] == [2, 2, 2, 2]
    # rank 0's two micro-batches, then rank 1's: the first sequences of each share
    assert groups[2].input_ids.equal(batch.split(2)[1].split(2)[0].input_ids)
    assert token_groups(dataclasses.replace(cfg, shape=DENSE), batch) == [batch]
    options = moe_options(cfg, 4)
    assert (options.aux_coef, options.z_coef) == (0.0025, 0.0005)
