"""Context parallel's pieces in one process: the zigzag placement (the cost model's), a
rank's share of a batch, the model's positions and key order (one device's arithmetic
unchanged), the mesh's cp groups, and uneven stage splits. The real runs (loss parity
with one process, bytes per mesh dim equal to the cost model's) are
``tests/cli/test_train_cli.py``'s; bitwise resume ``tests/distributed/test_checkpoint.py``'s."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from shardlab.config.model import ModelShape
from shardlab.distributed.context_parallel import key_positions, local_positions, shard_sequence
from shardlab.distributed.pipeline import layer_split
from shardlab.errors import SpecError
from shardlab.estimate.context import gathered_positions, rank_positions
from shardlab.nn.data import Batch
from shardlab.nn.model import TransformerLM, attention_mask, rope_tables

SHAPE = ModelShape("tiny", 2, 32, 4, 50, 16, kv_heads=2, style="llama", tied=False)
GPT = ModelShape("tiny-gpt", 2, 32, 4, 50, 16, style="gpt", tied=True)


@pytest.mark.parametrize(("seq", "cp"), [(16, 2), (16, 4), (24, 3), (8, 1)])
def test_positions_are_the_cost_models(seq: int, cp: int) -> None:
    """Rank i holds chunks i and 2cp-1-i (estimate.context's placement); the gathered keys
    come rank by rank."""
    for rank in range(cp):
        assert local_positions(seq, cp, rank).tolist() == rank_positions(seq, cp, rank)
    assert key_positions(seq, cp).tolist() == gathered_positions(seq, cp)
    assert sorted(key_positions(seq, cp).tolist()) == list(range(seq))


def _batch(b: int, s: int) -> Batch:
    ids = torch.arange(b * s).reshape(b, s) % SHAPE.vocab
    pad = torch.ones(b, s, dtype=torch.long)
    pad[0, -3:] = 0  # right-padded
    return Batch(ids, (ids + 1) % SHAPE.vocab, pad.clone(), pad)


def test_a_ranks_share_is_its_columns() -> None:
    batch = _batch(2, 8)
    shard = shard_sequence(batch, 2, 1)  # chunks 1 and 2 of 4: positions 2, 3, 4, 5
    assert shard.positions.tolist() == [2, 3, 4, 5]
    assert torch.equal(shard.batch.input_ids, batch.input_ids[:, 2:6])
    assert torch.equal(shard.batch.loss_mask, batch.loss_mask[:, 2:6])
    assert shard.keys.tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert torch.equal(shard.key_pad, batch.pad_mask[:, shard.keys])


def test_the_mask_is_the_whole_sequences_rows_and_columns() -> None:
    """A rank's queries over the gathered keys: the one-device mask's rows and columns."""
    pad = _batch(2, 8).pad_mask
    full = attention_mask(pad, 8, pad.device)
    for rank in range(2):
        pos, keys = local_positions(8, 2, rank), key_positions(8, 2)
        got = attention_mask(pad[:, keys], 4, pad.device, pos, keys)
        assert torch.equal(got, full[:, :, pos][:, :, :, keys])
    assert torch.equal(attention_mask(None, 8, pad.device, torch.arange(8)),
                       attention_mask(None, 8, pad.device))


def test_rope_at_positions_is_the_tables_rows() -> None:
    cos, sin = rope_tables(16, 8, torch.float32)
    pos = local_positions(16, 2, 0)
    c, s = rope_tables(8, 8, torch.float32, positions=pos)
    assert torch.equal(c, cos[pos]) and torch.equal(s, sin[pos])


@pytest.mark.parametrize("shape", [SHAPE, GPT], ids=["llama", "gpt"])
def test_positions_of_the_whole_sequence_change_nothing(shape: ModelShape) -> None:
    """``forward`` with every position given (and the keys in order) is one device's
    forward, bit for bit."""
    model = TransformerLM(shape)
    batch = _batch(2, 16)
    plain = model(batch.input_ids, batch.pad_mask)
    given = model(batch.input_ids, batch.pad_mask, positions=torch.arange(16),
                  keys=torch.arange(16))
    assert torch.equal(plain, given)


@pytest.mark.parametrize("shape", [SHAPE, GPT], ids=["llama", "gpt"])
def test_each_ranks_logits_are_the_whole_sequences(shape: ModelShape) -> None:
    """Two cp ranks emulated in one process: each attends with its own queries to keys a
    stand-in for the all-gather assembles from both ranks' K and V (the other rank's from
    its latest forward; after layers + 1 rounds every one is what a real all-gather
    delivers), and gets the one-device logits of its tokens."""
    model = TransformerLM(shape).double()
    batch = _batch(2, 16)
    whole = model(batch.input_ids, batch.pad_mask)
    shards = [shard_sequence(batch, 2, r) for r in range(2)]
    seen: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def gather_of(rank: int, layer: int) -> object:
        def gather(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            seen[rank, layer] = (k, v)
            other = seen.get((1 - rank, layer), (k, v))
            (k0, v0), (k1, v1) = ((k, v), other) if rank == 0 else (other, (k, v))
            return torch.cat([k0, k1], dim=2), torch.cat([v0, v1], dim=2)
        return gather

    out = {}
    for _ in range(shape.layers + 1):
        for rank in (0, 1):
            for i, block in enumerate(model.blocks):
                block.attn.kv_gather = gather_of(rank, i)
            args, kwargs = shards[rank].model_inputs()
            out[rank] = model(*args, **kwargs)
    for rank in (0, 1):
        torch.testing.assert_close(out[rank], whole[:, shards[rank].positions], rtol=0,
                                   atol=1e-12)


def test_uneven_stage_split() -> None:
    assert layer_split(4, 2, (3, 1)) == [range(0, 3), range(3, 4)]
    assert layer_split(6, 4, (2, 1, 2, 1)) == [range(0, 2), range(2, 3), range(3, 5),
                                               range(5, 6)]
    assert layer_split(5, 2) == [range(0, 3), range(3, 5)]
    for bad in ((3, 2), (4, 0), (2, 1, 1)):
        with pytest.raises(SpecError, match="stage_layers"):
            layer_split(4, 2, bad)


def test_the_mesh_gives_cp_gathers_a_group_of_their_own() -> None:
    """(pp, dp_replicate, dp_shard, cp, tp) on 16 fake ranks: rank order tp fastest, the
    K/V gathers' own group the ranks of the mesh's cp dim, FSDP's 2-D (replicate,
    dp_shard_cp) mesh, and the data-parallel group replicate x shard."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardlab.distributed.mesh import make_mesh

    rank = 13  # pp 1, replica 0, shard 1, cp 0, tp 1: 8 + 4 + 1
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=16)
    try:
        mesh = make_mesh("cpu", pp=2, dp=2, tp=2, cp=2, dp_replicate=1)
        assert dist.get_process_group_ranks(mesh.cp_group) == [13, 15]
        assert mesh["cp"].mesh.tolist() == [13, 15]
        assert mesh["fsdp"].mesh.tolist() == [9, 11, 13, 15]
        assert mesh["dp"].mesh.tolist() == [9, 13]
        assert mesh["cp"].get_local_rank() == 0 and mesh["dp"].get_local_rank() == 1
    finally:
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=16)
    try:
        mesh = make_mesh("cpu", pp=2, dp=4, tp=2, dp_replicate=2)
        assert mesh["fsdp"].mesh.tolist() == [[9, 11], [13, 15]]  # replicas x shards
        assert mesh["dp"].mesh.tolist() == [9, 11, 13, 15] and mesh.cp_group is None
    finally:
        dist.destroy_process_group()
