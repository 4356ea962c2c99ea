"""Context parallel, uneven pipeline stages and HSDP on virtual devices: each equals one
device to float64 precision, and its counted bytes equal the cost model's exactly."""

import pytest
import torch
from torch.testing import assert_close

from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError
from shardlab.estimate.context import kv_gather_bytes
from shardlab.nn.data import Batch, batches
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.model import attend, attention_mask, rope_tables
from shardlab.sim.context_parallel import gathered_attention, lane_mask, lane_positions
from shardlab.sim.ledger import Ledger
from shardlab.sim.parallel import Parallel
from shardlab.sim.run import layout_for, simulate_run
from shardlab.sim.virtual_group import VirtualGroup

V = garden_vocab().size
# Small, so the nine layouts below take a few seconds: 3 layers of 4 heads of 4 (GQA: 2
# kv heads), enough for uneven stages (2 + 1) and for tp = 2 to split the kv heads.
LLAMA = ModelShape("llama", 3, 16, 4, V, 32, kv_heads=2, d_ff=32, style="llama", tied=False)
GPT = ModelShape("gpt", 3, 16, 4, V, 32, style="gpt", tied=True)


def _batches(n: int, size: int = 4) -> list[Batch]:
    stream = batches(garden_documents(300, 1), size, 32, seed=1)
    out = [next(stream) for _ in range(n)]
    assert any(bool((b.pad_mask == 0).any()) for b in out)  # padding crosses the chunks
    return out


def test_gathered_attention_equals_attention_over_the_whole_sequence() -> None:
    # Rotary positions per chunk, grouped-query heads and the causal mask over the gathered
    # (rank-ordered) keys: two cp ranks' outputs are one device's rows at their positions.
    gen = torch.Generator().manual_seed(0)
    b, s, hd, cp = 2, 16, 8, 2
    q, k, v = (torch.randn(b, s, n * hd, generator=gen, dtype=torch.float64) for n in (4, 2, 2))
    pad = torch.ones(b, s, dtype=torch.long)
    pad[1, 11:] = 0
    rope = rope_tables(s, hd, torch.float64)
    whole = attend(q, k, v, hd, attention_mask(pad, s, pad.device), rope)
    group = VirtualGroup([0, 1], Ledger(), "cp")
    pos = [lane_positions(s, cp, c) for c in range(cp)]
    outs = gathered_attention(group, [q[:, p] for p in pos], [k[:, p] for p in pos],
                              [v[:, p] for p in pos], hd, [lane_mask(pad, cp, p) for p in pos],
                              [(rope[0][p], rope[1][p]) for p in pos])
    for p, out in zip(pos, outs, strict=True):
        assert_close(out, whole[:, p], rtol=1e-13, atol=1e-13)
    assert pos[0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15]  # chunks 0 and 3 of 4
    # K and V together, 2 heads x 8 wide, 8 tokens x 2 sequences x 8 bytes, to the other.
    assert group.ledger.sent(0, "cp", "all_gather") == 2 * 8 * 2 * 2 * 8 * 8


# cp = 2 alone: test_cp_bytes_by_hand_... below (with uneven pp) and tests/cli.
LAYOUTS = [
    (GPT, Parallel(cp=4)),                                               # learned positions
    (LLAMA, Parallel(dp=2, cp=2, zero=3, microbatches=2)),               # cp in FSDP's group
    (LLAMA, Parallel(cp=2, tp=2, sp=True)),
    (GPT, Parallel(cp=2, pp=2, microbatches=2)),                         # tied head, pp
    (LLAMA, Parallel(dp=2, tp=2, pp=2, zero=1, sp=True, microbatches=2,
                     stage_layers=(2, 1))),                               # uneven 1F1B
    (LLAMA, Parallel(dp=4, zero=2, dp_replicate=2)),                     # HSDP 2 x 2
    (LLAMA, Parallel(dp=4, cp=2, zero=3, dp_replicate=2)),               # HSDP with cp
]


@pytest.mark.parametrize(("shape", "par"), LAYOUTS,
                         ids=lambda x: x.name if isinstance(x, ModelShape) else
                         f"dp{x.dp}cp{x.cp}tp{x.tp}pp{x.pp}z{x.zero}r{x.dp_replicate}"
                         f"{'+'.join(map(str, x.stage_layers))}")
def test_layout_equals_one_device_and_its_bytes_the_cost_model(shape: ModelShape,
                                                               par: Parallel) -> None:
    r = simulate_run(shape, par, _batches(1, max(4, par.dp * par.microbatches)), torch.float64)
    failed = [(c.name, c.value) for c in r.checks if not c.passed]
    assert not failed, failed
    assert r.max_param_diff <= 1e-12 and r.max_loss_diff <= 1e-12
    names = {c.name for c in r.checks}
    assert ("comm.cp" in names) == (par.cp > 1)
    counted = r.comm["cp"]["counted_bytes"]
    assert all(counted) if par.cp > 1 else not any(counted)


def test_cp_bytes_by_hand_and_uneven_stages_in_proportion() -> None:
    r = simulate_run(LLAMA, Parallel(cp=2, pp=2, microbatches=2, stage_layers=(2, 1)),
                     _batches(1), torch.float64)
    # b = 2, 16 tokens a rank, K and V of 2 heads x 4 in fp64, to the one other rank, in
    # forward and back: per layer and micro-batch 2 x 2 x 16 x 16 x 8 bytes; devices
    # (c, s) = (0, 0), (0, 1), (1, 0), (1, 1) hold 2, 1, 2, 1 layers, 2 micro-batches.
    per = 2 * 2 * 16 * 16 * 8
    assert per == 2 * kv_gather_bytes(LLAMA, r.layout)
    assert r.comm["cp"]["counted_bytes"] == [2 * 2 * per, 2 * per, 2 * 2 * per, 2 * per]
    assert r.passed


def test_what_the_simulator_refuses() -> None:
    moe = ModelShape("moe", 2, 32, 4, V, 32, style="llama", tied=False,
                     moe=MoE(experts=4, experts_per_token=2, expert_d_ff=16))
    with pytest.raises(SpecError, match="cp=2: the simulator runs context parallel on dense"):
        layout_for(moe, Parallel(cp=2), 2, 32, torch.float64)
    with pytest.raises(SpecError, match="cp=3: must split seq"):
        layout_for(LLAMA, Parallel(cp=3), 2, 32, torch.float64)
    with pytest.raises(SpecError, match="stage_layers='2\\+2'"):
        layout_for(LLAMA, Parallel(pp=2, stage_layers=(2, 2)), 2, 32, torch.float64)


def test_device_places_invert_global_ids() -> None:
    par = Parallel(dp=2, cp=3, tp=2, pp=2)
    seen = {par.rank(d * 3 + c, s, t): (d, c, s, t) for d in range(2) for c in range(3)
            for s in range(2) for t in range(2)}
    assert sorted(seen) == list(range(24))
    assert all(par.place(r) == place for r, place in seen.items())
