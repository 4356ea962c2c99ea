"""MoE pieces of the step-time model a run can state: the flex (DeepEP) dispatcher's rows,
Megatron-LM's MoE layers without tensor-parallel collectives around their MLP, and the
data-parallel ring that hides behind NVLink collectives."""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError
from shardlab.estimate.fp8 import cast_bytes
from shardlab.plan.expert_time import (
    SM_CARVE_OUT,
    alltoall_layer_seconds,
    dropped_train_flops,
    ep_members_per_node,
    ep_overlap,
    groups_per_token,
    ranks_per_token,
)
from shardlab.plan.layer_time import layer_forward
from shardlab.plan.memory_bound import permute_seconds
from shardlab.plan.options import step_options_for
from shardlab.plan.overlap import FRAMEWORKS, FUSED_LOSS_BYTES, nvlink_waits
from shardlab.plan.search import device_of, layout_candidates, layout_step_keys, plan
from shardlab.plan.space import Space
from shardlab.plan.step_time import StepOptions

H100 = get_accelerator("h100")
BF16 = get_policy("bf16")
LINK = H100.efficiency.link_fraction if H100.efficiency else 1.0


def moe_model(experts: int = 8, k: int = 2, shared: int = 0, layers: int = 4) -> ModelShape:
    return ModelShape("tiny-moe", layers, 512, 8, vocab=1024, context=1024, style="llama",
                      tied=False, d_ff=1024,
                      moe=MoE(experts=experts, experts_per_token=k, expert_d_ff=256,
                              shared_experts=shared, shared_d_ff=256 if shared else 0))


def one(model: ModelShape, gpus: int, text: str, options: StepOptions) -> dict:
    space = Space(gpus=gpus, global_batch=gpus, seq=1024)
    return plan(model, H100, space, BF16, only=layout_candidates(model, space, text),
                options=options).best[0]


@pytest.mark.parametrize(("experts", "k", "ep"), [(8, 2, 4), (8, 3, 2), (12, 4, 3)])
def test_random_routing_touches_the_expected_number_of_ranks(experts: int, k: int,
                                                             ep: int) -> None:
    # Every k-subset of the experts equally likely: the mean count of distinct ranks.
    local = experts // ep
    counts = [len({e // local for e in s}) for s in itertools.combinations(range(experts), k)]
    m = moe_model(experts, k)
    assert ranks_per_token(m, np.array([ep]))[0] == pytest.approx(np.mean(counts), rel=1e-12)


def test_contiguous_routing_spans_the_ranks_of_its_window() -> None:
    # NeMo AutoModel's FakeBalancedGate: token i takes experts 8i..8i+7 of 128; 16 experts
    # a rank (ep 8): every window inside one rank. 8 experts of 2 per rank, k = 3: windows
    # start at 0, 3, 6, 1, 4, 7, 2, 5 and each spans two ranks.
    assert ranks_per_token(moe_model(128, 8), np.array([8]), "contiguous")[0] == 1.0
    assert ranks_per_token(moe_model(8, 3), np.array([4]), "contiguous")[0] == 2.0


def test_flex_dispatch_sends_each_token_once_per_rank() -> None:
    m = moe_model(8, 2)
    space = Space(gpus=8, global_batch=8, seq=1024)
    c = layout_candidates(m, space, "dp=8 ep=4 etp=1 micro_batch=1")
    lat, bw = np.zeros(1), np.full(1, 1e11)
    a2a = alltoall_layer_seconds(m, c, 1024, BF16, lat, bw)
    flex = alltoall_layer_seconds(m, c, 1024, BF16, lat, bw, "flex", "random")
    d = 4 * (1 - math.comb(6, 2) / math.comb(8, 2))
    assert flex[0] == pytest.approx(a2a[0] * d / 2, rel=1e-12)
    # By hand: 1,024 tokens x 2 experts, 3/4 of them to the other ranks, 512 x 2 bytes each,
    # dispatch and combine forward and backward.
    assert a2a[0] == pytest.approx(4 * 0.75 * 2048 * 1024 / 1e11, rel=1e-12)


def test_an_ep_group_across_nodes_sends_only_its_remote_rows_over_the_network() -> None:
    # ep 16 over 2 nodes of 8: of the T·k rows spread over 16 ranks, 7/16 go to peers in
    # the node (NVLink) and 8/16 to the other node (one NIC), both at once.
    m = moe_model(16, 2)
    space = Space(gpus=16, global_batch=16, seq=1024)
    c = layout_candidates(m, space, "dp=16 ep=16 etp=1 micro_batch=1")
    assert ep_members_per_node(c, np.ones(1), 8).tolist() == [8]
    nvl, net = (np.zeros(1), np.full(1, 4e11)), (np.zeros(1), np.full(1, 4e10))
    rows = 1024 * 2 * 512 * 2  # bytes of the T·k rows, bf16
    across = alltoall_layer_seconds(m, c, 1024, BF16, *nvl, inter=net, per_node=np.array([8]))
    assert across[0] == pytest.approx(4 * max(rows * 7 / 16 / 4e11, rows * 8 / 16 / 4e10),
                                      rel=1e-12)
    # Inside one node (per_node = ep) it is the old single-link figure.
    inside = alltoall_layer_seconds(m, c, 1024, BF16, *nvl, inter=net, per_node=np.array([16]))
    assert inside[0] == pytest.approx(
        alltoall_layer_seconds(m, c, 1024, BF16, *nvl)[0], rel=1e-12)
    assert inside[0] == pytest.approx(4 * rows * 15 / 16 / 4e11, rel=1e-12)
    # Latency: 7 NVLink peers and 8 remote ones.
    slow = alltoall_layer_seconds(m, c, 1024, BF16, np.full(1, 1e-6), nvl[1],
                                  inter=(np.full(1, 1e-5), net[1]), per_node=np.array([8]))
    assert slow[0] - across[0] == pytest.approx(4 * (7e-6 + 8e-5), rel=1e-9)


def test_the_planner_prices_an_ep_group_across_nodes_on_both_links() -> None:
    # 16 H100 in 2 nodes, ep 16, one micro-batch of one sequence, 4 layers.
    m = moe_model(16, 2)
    space = Space(gpus=16, global_batch=16, seq=1024)
    c = layout_candidates(m, space, "dp=16 ep=16 etp=1 micro_batch=1")
    b = one(m, 16, "dp=16 ep=16 etp=1 micro_batch=1", StepOptions())
    nvl = (np.full(1, H100.intra_link.latency), np.full(1, H100.intra_link.bandwidth * LINK))
    net = (np.full(1, H100.inter_link.latency), np.full(1, H100.inter_link.bandwidth * LINK))
    per_layer = alltoall_layer_seconds(m, c, 1024, BF16, *nvl, inter=net,
                                       per_node=np.array([8]))
    assert b["breakdown"]["ep_comm"] == pytest.approx(4 * per_layer[0], rel=1e-9)
    # Less than every row on the NIC (the network only), more than every row on NVLink.
    assert 4 * alltoall_layer_seconds(m, c, 1024, BF16, *net)[0] > b["breakdown"]["ep_comm"]
    assert 4 * alltoall_layer_seconds(m, c, 1024, BF16, *nvl)[0] < b["breakdown"]["ep_comm"]


def test_flex_across_nodes_sends_a_token_once_per_remote_node() -> None:
    # DeepEP's internode dispatch: over RDMA each token goes once to each other node holding
    # one of its experts; 2 nodes of 8 experts each, k = 2 random experts of 16.
    m = moe_model(16, 2)
    d_node = 2 * (1 - math.comb(8, 2) / math.comb(16, 2))
    assert groups_per_token(m, np.array([2]))[0] == pytest.approx(d_node, rel=1e-12)
    space = Space(gpus=16, global_batch=16, seq=1024)
    c = layout_candidates(m, space, "dp=16 ep=16 etp=1 micro_batch=1")
    nvl, net = (np.zeros(1), np.full(1, 1e15)), (np.zeros(1), np.full(1, 4e10))
    flex = alltoall_layer_seconds(m, c, 1024, BF16, *nvl, "flex", "random", net,
                                  np.array([8]))
    assert flex[0] == pytest.approx(4 * 1024 * d_node / 2 * 512 * 2 / 4e10, rel=1e-9)


def test_megatron_moe_layers_run_no_collective_around_their_mlp() -> None:
    # tp 2 with sequence parallelism, whole experts: per layer 4 all-reduces' worth (2 for
    # the attention, 2 for the MLP), plus the embedding's and the head's. Routing each rank's
    # own tokens leaves the attention's 2: (2L + 2) / (4L + 2) of the gathered case.
    text = "dp=4 tp=2 ep=4 etp=1 sp=1 micro_batch=1"
    m = moe_model()
    on, off = (one(m, 8, text, StepOptions(moe_sequence_split=s))["breakdown"]["tp_comm"]
               for s in (True, False))
    assert on / off == pytest.approx((2 * 4 + 2) / (4 * 4 + 2), rel=1e-9)
    # A shared expert keeps the MLP's collectives; so does an expert split over tp.
    shared = moe_model(shared=1)
    assert (one(shared, 8, text, StepOptions(moe_sequence_split=True))["breakdown"]["tp_comm"]
            == pytest.approx(one(shared, 8, text, StepOptions())["breakdown"]["tp_comm"]))
    split = "dp=4 tp=2 ep=2 etp=2 sp=1 micro_batch=1"
    assert (one(m, 8, split, StepOptions(moe_sequence_split=True))["breakdown"]["tp_comm"]
            == pytest.approx(one(m, 8, split, StepOptions())["breakdown"]["tp_comm"]))


def test_a_ring_across_nodes_hides_behind_nvlink_waits() -> None:
    waits = nvlink_waits((np.array([1.0, 1.0]), np.array([True, False])),
                         (np.array([2.0, 2.0]), np.array([True, True])),
                         dp_inside=np.array([False, False]))
    assert waits.tolist() == [3.0, 2.0]
    assert nvlink_waits((np.ones(1), np.ones(1, bool)), dp_inside=np.ones(1, bool))[0] == 0.0
    # DDP over 2 nodes of tp 8: the gradient all-reduce hides behind the last micro-batch's
    # backward, 2/3 of its compute and of its (exposed) tensor-parallel waits.
    m = ModelShape("wide", 4, 4096, 32, vocab=1024, context=1024, style="llama", tied=False,
                   d_ff=16384)
    space = Space(gpus=16, global_batch=2, seq=1024)
    b = plan(m, H100, space, BF16, only=layout_candidates(m, space, "dp=2 tp=8 zero=0"),
             options=StepOptions()).best[0]
    parts, comm = b["breakdown"], b["breakdown"]["dp_comm"] + b["hidden"]["dp_comm"]
    window = 2 * (parts["compute"] + parts["tp_comm"]) / 3 + parts["recompute"]
    assert parts["tp_comm"] > 0 and comm > window
    assert parts["dp_comm"] == pytest.approx(max(comm - window, comm / 4), rel=1e-9)


def test_stated_dispatcher_routing_and_fused_loss_override_the_framework() -> None:
    keys = layout_step_keys("dp=8 dispatcher=Flex routing=contiguous fused_loss=1")
    opts = step_options_for(H100, flash=True, framework="megatron", overrides=keys)
    assert (opts.dispatcher, opts.routing, opts.loss_bytes) == ("flex", "contiguous",
                                                                FUSED_LOSS_BYTES)
    plain = step_options_for(H100, flash=True, framework="megatron")
    assert (plain.dispatcher, plain.routing, plain.loss_bytes) == ("alltoall", "random", 52)
    assert plain.moe_sequence_split and not step_options_for(
        H100, flash=True, framework="torchtitan").moe_sequence_split
    with pytest.raises(SpecError, match=r"dispatcher.*alltoall, flex"):
        step_options_for(H100, flash=True, overrides={"dispatcher": "deepep"})
    with pytest.raises(SpecError, match=r"routing.*random, contiguous"):
        step_options_for(H100, flash=True, overrides={"routing": "greedy"})


def test_mfu_counts_only_the_assignments_a_capacity_factor_keeps() -> None:
    # 8 experts top-2, 1,024 tokens a rank: 2,048 assignments, 256 an expert if balanced;
    # capacity 0.25 keeps ceil(0.25 x 256) = 64 of them an expert, a quarter.
    m = moe_model(8, 2)
    space = Space(gpus=8, global_batch=8, seq=1024)
    c = layout_candidates(m, space, "dp=8 ep=4 etp=1 micro_batch=1 capacity_factor=0.25")
    routed = 6.0 * 3 * 512 * 256 * 2 * 4  # x 3 matrices, d 512, f 256, top-2, 4 MoE layers
    assert dropped_train_flops(m, c, 1024)[0] == pytest.approx(routed * 0.75, rel=1e-12)
    dropless = layout_candidates(m, space, "dp=8 ep=4 etp=1 micro_batch=1")
    assert dropped_train_flops(m, dropless, 1024)[0] == 0.0
    # Dropping nearly every assignment once put the MFU above 100%.
    text = "dp=8 ep=4 etp=1 micro_batch=1 capacity_factor=0.0001"
    assert one(m, 8, text, StepOptions())["mfu"] < 1.0


def test_ep_overlap_hides_the_paired_all_to_alls_at_a_carve_out() -> None:
    """Megatron-Core's merged FWD-BWD (the MoE report, Section 4.2.3): without a pipeline
    the first forward and the last backward stay exposed (1 of m), the rest hides behind
    the paired compute as far as it lasts, which runs 20% slower meanwhile; a pipeline
    needs the interleaved schedule, full recompute none of it."""
    sp = Space(gpus=16, global_batch=64, seq=4096)
    c = layout_candidates(get_model("mixtral-8x7b"), sp, "dp=16 ep=8 micro_batch=1")
    m = float(c.microbatches[0])  # 4
    ep, comp = np.array([2.0]), np.array([10.0])
    exposed, hidden, slow = ep_overlap(ep, comp, c, True)
    assert hidden[0] == pytest.approx(2.0 * (1 - 1 / m))
    assert exposed[0] == pytest.approx(2.0 / m) and slow[0] == pytest.approx(SM_CARVE_OUT
                                                                             * hidden[0])
    # The window limits it: compute shorter than the all-to-alls.
    assert ep_overlap(np.array([20.0]), comp, c, True)[1][0] == pytest.approx(10 * (1 - 1 / m))
    assert ep_overlap(ep, comp, c, False)[1][0] == 0.0
    for text in ("dp=8 pp=2 ep=8 micro_batch=1", "dp=16 ep=8 micro_batch=1 recompute=full"):
        other = layout_candidates(get_model("mixtral-8x7b"), sp, text)
        assert ep_overlap(ep, comp, other, True)[1][0] == 0.0
    # Interleaved: rank 0's warm-up 2(pp-1) + (v-1)·pp + 1 forwards stay unpaired.
    inter = layout_candidates(get_model("mixtral-8x7b"), Space(gpus=16, global_batch=128,
                                                               seq=4096),
                              "dp=8 pp=2 virtual=2 ep=8 micro_batch=1")
    warm, passes = 2 * 1 + 1 * 2 + 1, float(inter.microbatches[0]) * 2
    assert ep_overlap(ep, comp, inter, True)[1][0] == pytest.approx(2.0 * (1 - warm / passes))


def test_permutation_moves_each_kept_row_both_ways() -> None:
    """Per MoE layer and direction: (3R + T)·h elements (the permute reads and writes the R
    kept rows, the unpermute reads them and writes the T tokens), averaged over the layers;
    a dense model none."""
    m = get_model("mixtral-8x7b")  # top 2 of 8, every layer MoE
    c = layout_candidates(m, Space(gpus=8, global_batch=8, seq=4096), "dp=8 ep=8")
    tokens, rows = 4096.0, 4096.0 * 2
    expect = (3 * rows + tokens) * 4096 * 2 / 1e12
    assert permute_seconds(m, c, 4096, 2, 1e12)[0] == pytest.approx(expect, rel=1e-12)
    dense = get_model("llama-3-8b")
    d = layout_candidates(dense, Space(gpus=8, global_batch=8, seq=4096), "dp=8")
    assert permute_seconds(dense, d, 4096, 2, 1e12)[0] == 0.0


def test_fp8_casts_of_a_moe_layer_quantize_every_routed_copy() -> None:
    """The MLP's first linear reads, and its last writes, k copies of each token in a MoE
    layer (k = 2 for Mixtral): (1 + k)·T·h forward input and backward gradient elements
    where a dense layer has 2·T·h."""
    m = get_model("mixtral-8x7b")
    one = cast_bytes(m, 4096.0, 1.0, False, 0.0, 1, 1.0)
    two = cast_bytes(m, 4096.0, 1.0, False, 0.0, 1, 2.0)
    assert two[0] - one[0] == pytest.approx(4096 * 4096)
    assert two[1] - one[1] == pytest.approx(4096 * 4096)


def test_each_local_experts_matmuls_are_launches_of_their_own_in_megatron() -> None:
    """A MoE layer's fixed launch costs: the dense MLP's three operators replaced by the
    experts' matmuls and five more (router matmul and top-k, permute, activation,
    unpermute), at the curve's op_overhead each: one grouped kernel per matmul (9 + 2 + 5),
    or with Megatron-Core's Transformer Engine experts one GEMM per local expert
    (9 + 2·E/ep + 5)."""
    m = get_model("mixtral-8x7b")  # 8 experts
    dev = device_of(H100, BF16, 8)[0]
    bare = replace(dev, eff=replace(dev.eff, op_overhead=0.0))
    for per_expert in (False, True):
        for ep in (2, 8):
            c = layout_candidates(m, Space(gpus=8, global_batch=8, seq=4096), f"dp=8 ep={ep}")
            kw = {"moe_layer": True, "c": c, "expert_launches": per_expert}
            launch = (layer_forward(m, 4096, c.tp, c.micro_batch, dev, **kw).matmul
                      - layer_forward(m, 4096, c.tp, c.micro_batch, bare, **kw).matmul)
            ops = 9 + (2 * 8 / ep if per_expert else 2) + 5
            assert float(launch[0]) == pytest.approx(ops * dev.eff.op_overhead)
    assert FRAMEWORKS["megatron"].expert_launches and not FRAMEWORKS["torchtitan"].expert_launches
