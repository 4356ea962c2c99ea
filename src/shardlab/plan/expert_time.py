"""Mixture-of-experts pieces of the step-time model (:mod:`shardlab.plan.step_time`),
vectorised over layouts: the tokens each rank routes, the assignments it keeps under a
capacity factor, and the seconds of the expert-parallel all-to-alls.

The formulas are :mod:`shardlab.estimate.expert`'s balanced case (GShard, Lepikhin et
al. 2020; Switch Transformer, Fedus et al. 2022, for the capacity), over numpy arrays.
An all-to-all in which each rank sends n bytes to its p - 1 peers costs
(p-1)·α + n/B (pairwise exchange, Thakur, Rabenseifner & Gropp 2005). The ep group spans
ep·etp consecutive ranks (expert tensor innermost, then ep: Megatron-LM's expert mesh,
where with etp = 1 the tensor-parallel ranks join the ep group, as in torchtitan): inside
a node while ep·etp <= devices
per node, else across the inter-node link.

**Dispatchers** (``dispatcher=``, a run's ``--moe-token-dispatcher-type``): ``alltoall``
(Megatron-LM's NCCL dispatcher, torchtitan's) permutes the T·k assignments by expert and
sends every one, so a token whose k experts share a rank crosses the link k times over.
``flex`` (Megatron-LM's flex dispatcher with DeepEP, NeMo AutoModel's DeepEP experts)
sends each token once to each rank that holds one of its experts and sums that rank's
expert outputs before the combine sends them back (DeepEP ``get_dispatch_layout`` returns
``is_token_in_rank`` [tokens, ranks], its ``dispatch`` one row per token and rank;
Megatron-LM ``_DeepepManager`` at 1e057005 dispatches the unpermuted [T, h] and permutes
locally; its MoE README: flex "removes redundant tokens"): T·D rows, D the distinct ranks
a token's experts lie on (:func:`ranks_per_token`). How the experts are drawn
(``routing=``): ``random``, k distinct experts uniformly at random, or under the model's
group limit (``MoE.groups``: :func:`grouped_choice`) from its best groups (Megatron-LM's
``--moe-router-force-load-balancing``: i.i.d. normal logits, ``RandomSTE``, at 1e057005;
what the balanced case means), D = ep·(1 - C(E - E/ep, k)/C(E, k)) (the expected number
of ranks, of E/ep experts each, that a random k-subset touches); ``contiguous``, token i
takes experts (i·k + j) mod E, j < k (NeMo AutoModel's ``FakeBalancedGate``, commit
8d9bfb90e), D the mean number of ranks such a window spans.

**An ep group across nodes** (k members in each of ep/k nodes) moves each byte once, on the
link to its destination, and both links at once: an NCCL all-to-all is p - 1 concurrent
sends, those to the k - 1 peers in the node over NVLink and the others over the rank's
one NIC ("Alltoall cannot aggregate the bandwidth of multiple NICs", NVIDIA/nccl-tests
issue 267), so of the rows spread evenly over ep ranks (k-1)/ep cross NVLink and
(ep-k)/ep the network, and the slower of the two sets the time. DeepEP's internode
kernels (the flex dispatcher across nodes) send a token once per remote node that holds
one of its experts over RDMA and forward it there over NVLink ("Normal kernels with
NVLink and RDMA forwarding", DeepEP docs/legacy.md at dd758ca; its dispatch layout counts
``num_tokens_per_rdma_rank``): T·D_node·(n-1)/n rows on the NIC, D_node the distinct
nodes of n = ep/k (:func:`groups_per_token` over nodes), and every distinct remote rank's
copy on NVLink. DeepEP measured 43-58 GB/s of RDMA "bottleneck bandwidth" for EP 16-64
on 400 Gb/s NICs there: the NIC's rate, as the inter-node link here prices it.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import RECOMPUTE, SCHEDULES
from shardlab.config.model import ModelShape
from shardlab.estimate.expert import ep_members_per_node as ep_node_members
from shardlab.estimate.expert import moe_flops_per_token
from shardlab.plan.space import Candidates

DISPATCHERS: tuple[str, ...] = ("alltoall", "flex")
"""Token dispatchers a run can name (``dispatcher=``): module docstring."""
ROUTINGS: tuple[str, ...] = ("random", "contiguous")
"""How a balanced run draws each token's experts (``routing=``): module docstring."""


def groups_per_token(model: ModelShape, groups: np.ndarray, routing: str = "random"
                     ) -> np.ndarray:
    """The mean number of distinct groups, of E/g consecutive experts each, that one
    token's k experts lie on, per layout (g = ``groups``: ranks of an ep group, or its
    nodes; module docstring)."""
    e = model.moe
    assert e is not None
    big, k = e.experts, e.experts_per_token
    uniq, inv = np.unique(np.asarray(groups, np.int64), return_inverse=True)
    out = []
    for p in uniq.tolist():
        local = big // max(p, 1)
        if routing == "random" and e.groups > 1:
            out.append(grouped_spread(big, k, e.groups, e.group_topk, max(p, 1)))
        elif routing == "contiguous":
            # Token i's window starts at (i·k) mod E; its groups repeat with period E.
            spans = [len({((i * k + j) % big) // local for j in range(k)}) for i in range(big)]
            out.append(float(np.mean(spans)))
        else:
            miss = math.comb(big - local, k) / math.comb(big, k)
            out.append(p * (1.0 - miss))
    return np.asarray(out, float)[inv.ravel()]


GROUPED_SAMPLES = 8192
"""Tokens drawn to take :func:`grouped_spread`'s expectation (fixed seed: the same answer
every time; over seeds 0-19 its sample standard deviation was 0.06%, 0.15% and 0.12% of
the mean at DeepSeek-V3's 8, 32 and 64 bins)."""


@functools.lru_cache(maxsize=16)
def grouped_choice(experts: int, k: int, groups: int, group_topk: int) -> np.ndarray:
    """The k experts each of :data:`GROUPED_SAMPLES` tokens takes under group-limited
    routing with random logits (what ``--moe-router-force-load-balancing`` draws:
    Megatron-Core's router applies ``apply_random_logits`` and then its usual routing):
    sigmoid scores of normal logits, each group scored by the sum of its top k/group_topk,
    the ``group_topk`` best groups kept, the top k experts among them (Megatron-Core
    ``group_limited_topk``; DeepSeek-V3's node-limited routing, Sec. 2.1.2), sorted."""
    rng = np.random.default_rng(0)
    scores = 1.0 / (1.0 + np.exp(-rng.standard_normal((GROUPED_SAMPLES, experts))))
    per_group = scores.reshape(GROUPED_SAMPLES, groups, experts // groups)
    top = k // group_topk
    best = np.partition(per_group, -top, axis=-1)[..., -top:].sum(axis=-1)
    keep = np.argpartition(best, -group_topk, axis=-1)[:, -group_topk:]
    mask = np.zeros((GROUPED_SAMPLES, groups), bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    masked = np.where(np.repeat(mask, experts // groups, axis=-1), scores, -1.0)
    chosen = np.sort(np.argpartition(masked, -k, axis=-1)[:, -k:], axis=-1)
    chosen.flags.writeable = False  # cached: shared by every later caller
    return chosen


def grouped_spread(experts: int, k: int, groups: int, group_topk: int, bins: int) -> float:
    """The mean number of distinct bins, of experts/bins consecutive experts each, that one
    token's k experts lie on under group-limited routing (:func:`grouped_choice`): an
    expectation over its tokens. Expert e lies in bin e·bins // experts: E/bins consecutive
    experts each when ``bins`` divides them, as nearly even bins otherwise."""
    bins = max(1, min(bins, experts))
    bin_of = grouped_choice(experts, k, groups, group_topk) * bins // experts
    return float(1.0 + (np.diff(bin_of, axis=-1) != 0).sum(axis=-1).mean())


def ranks_per_token(model: ModelShape, ep: np.ndarray, routing: str = "random"
                    ) -> np.ndarray:
    """D: the mean number of distinct ranks of the ep group (E/ep consecutive experts
    each) that one token's k experts lie on, per layout (module docstring)."""
    return groups_per_token(model, ep, routing)


def kept_rows(model: ModelShape, tokens: np.ndarray, capacity_factor: np.ndarray
              ) -> np.ndarray:
    """Assignments a rank routing ``tokens`` keeps per micro-batch with balanced routing:
    T·k, or E·min(T·k/E, ceil(c·T·k/E)) with capacity factor c > 0
    (:func:`shardlab.estimate.expert.expert_alltoall_bytes`'s balanced case)."""
    e = model.moe
    assert e is not None
    assigned = tokens * e.experts_per_token
    cap = np.ceil(capacity_factor * assigned / e.experts) * e.experts
    return np.where(capacity_factor > 0, np.minimum(assigned, cap), assigned)


def dropped_train_flops(m: ModelShape, c: Candidates, seq: int) -> np.ndarray:
    """Training FLOPs per token the routed experts skip for the assignments a capacity
    factor drops (forward and backward, 3 x 2 per weight a row passes), per layout: 0 for
    a dense model or dropless routing. A step's model FLOPs are the work done, so the MFU
    of a capped layout counts only the kept assignments."""
    e = m.moe
    if e is None or not m.moe_layers:
        return np.zeros(len(c))
    tokens = routed_tokens(c, seq)
    kept = kept_rows(m, tokens, c.capacity_factor) / (tokens * e.experts_per_token)
    return 3.0 * moe_flops_per_token(m)["routed"] * (1.0 - kept)


def routed_tokens(c: Candidates, seq: int) -> np.ndarray:
    """T per rank and micro-batch (:func:`shardlab.estimate.expert.layout_tokens`): b·s/cp,
    over tp under sequence parallelism with whole experts."""
    tokens = c.micro_batch * seq / c.cp
    return np.where(c.sp & (c.etp == 1), tokens / c.tp, tokens)


def ep_members_per_node(c: Candidates, cp: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Members of each layout's ep group in one node
    (:func:`shardlab.estimate.expert.ep_members_per_node` over the layouts); a folded expert
    mesh (:attr:`~shardlab.plan.space.Candidates.fold`) puts its ep ranks etp apart with no
    cp rank between them."""
    return ep_node_members(c.ep, c.etp, 1 if c.fold else cp, gpus_per_node)


def alltoall_seconds(m: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                     latency: np.ndarray, bandwidth: np.ndarray,
                     dispatcher: str = "alltoall", routing: str = "random",
                     inter: tuple[np.ndarray, np.ndarray] | None = None,
                     per_node: np.ndarray | None = None) -> np.ndarray:
    """Seconds of one MoE layer's one all-to-all (a dispatch, or a combine: the same rows
    come back) per micro-batch, per layout; 0 where ep = 1. Each rank sends (ep-1)/ep of its
    rows: the T·k kept assignments (``alltoall``), or each token once per rank its experts
    lie on, T·D times the kept share (``flex``: module docstring). ``latency`` (s) and
    ``bandwidth`` (bytes/s) are the link inside a node; an ep group with ``per_node``
    members in each node (None: all in one) sends its remote share over ``inter``, the
    network link, at the same time (module docstring)."""
    if m.moe is None:
        return np.zeros(len(c))
    ep = c.ep.astype(float)
    k_node = ep if per_node is None else np.clip(np.asarray(per_node, float), 1.0, ep)
    nodes = ep / k_node
    tokens = routed_tokens(c, seq)
    rows = kept_rows(m, tokens, c.capacity_factor)
    row_bytes = m.d_model * policy.activation_bytes
    if dispatcher == "flex":
        share = rows / m.moe.experts_per_token  # each token's kept share
        local = share * ranks_per_token(m, c.ep, routing) * (ep - 1) / ep
        node_groups = np.maximum(np.rint(nodes), 1).astype(np.int64)
        remote = share * groups_per_token(m, node_groups, routing) * (nodes - 1) / nodes
        hops = nodes - 1
    else:
        local, remote = rows * (k_node - 1) / ep, rows * (ep - k_node) / ep
        hops = ep - k_node
    lat_net, bw_net = (latency, bandwidth) if inter is None else inter
    one = ((k_node - 1) * latency + hops * lat_net
           + np.maximum(local * row_bytes / bandwidth,
                        np.where(remote > 0, remote * row_bytes / bw_net, 0.0)))
    return np.where(c.ep > 1, one, 0.0)


def alltoall_layer_seconds(m: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                           latency: np.ndarray, bandwidth: np.ndarray,
                           dispatcher: str = "alltoall", routing: str = "random",
                           inter: tuple[np.ndarray, np.ndarray] | None = None,
                           per_node: np.ndarray | None = None) -> np.ndarray:
    """Seconds of one layer's expert-parallel all-to-alls per micro-batch (dispatch and
    combine, forward, backward and, under full recompute, forward again: each one
    :func:`alltoall_seconds`), averaged over the model's layers (dense ones have none)."""
    if m.moe is None or not m.moe_layers:
        return np.zeros(len(c))
    one = alltoall_seconds(m, c, seq, policy, latency, bandwidth, dispatcher, routing, inter,
                           per_node)
    calls = 2.0 * np.where(c.recompute == RECOMPUTE.index("full"), 3.0, 2.0)
    return calls * one * (m.moe_layers / m.layers)


SM_CARVE_OUT = 0.2
"""How much slower the matmuls run beside an overlapped all-to-all, whose kernels hold SMs
of their own: "DeepEP uses 20 SMs per GPU and introduces roughly 20% GEMM-efficiency
overhead" (Megatron-Core MoE report, arXiv 2603.07685, Section 4.2.3; the same share is
charged to NCCL's all-to-all, whose channels also take SMs)."""


def ep_overlap(ep_step: np.ndarray, compute_step: np.ndarray, c: Candidates,
               on: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(exposed, hidden, slowdown) seconds per step of the expert-parallel all-to-alls
    under Megatron-Core's EP overlap (``--overlap-moe-expert-parallel-comm``, ``overlap_ep``):
    the forward of one micro-batch runs merged with the backward of another on two streams,
    each one's dispatch and combine beside the other's attention and MLP (the MoE report,
    Section 4.2.3: "The first FWD and last BWD remain on the end-to-end critical path").
    The warm-up forwards and cool-down backwards are unpaired: on the first pipeline rank
    w = 2(pp-1) + (v-1)·pp + 1 of its m·v forward passes (Megatron-LM schedules.py: the
    interleaved warm-up, "one extra micro-batch forward step" with the overlap), 1 of m
    without a pipeline; their share of the all-to-alls stays exposed. The paired rest hides
    behind the paired passes' compute as far as it lasts, and that compute runs
    :data:`SM_CARVE_OUT` slower while it does. Megatron allows it with ep > 1, an
    interleaved schedule when pp > 1, and no full recompute (transformer_config.py);
    elsewhere, or ``on`` false, everything stays exposed."""
    if not on:
        zero = np.zeros_like(ep_step)
        return ep_step, zero, zero
    pp, v = c.pp.astype(float), c.virtual.astype(float)
    allowed = (((c.pp == 1) | (c.schedule == SCHEDULES.index("interleaved-1f1b")))
               & (c.recompute != RECOMPUTE.index("full")) & (c.ep > 1))
    warm = np.where(c.pp == 1, 1.0, 2 * (pp - 1) + (v - 1) * pp + 1)
    unpaired = np.minimum(1.0, warm / (c.microbatches * v))
    hidden = np.where(allowed, np.minimum(ep_step * (1 - unpaired),
                                          compute_step * (1 - unpaired)), 0.0)
    return ep_step - hidden, hidden, SM_CARVE_OUT * hidden


def moe_split_share(m: ModelShape, c: Candidates, split: bool) -> np.ndarray:
    """Per layout, the share of the model's layers that are MoE layers running no
    tensor-parallel collective around their MLP: with ``split``
    (:attr:`~shardlab.plan.step_inputs.StepOptions.moe_sequence_split`), whole experts
    (etp 1) and no shared expert; 0 otherwise."""
    if not split or m.moe is None or m.moe.shared_experts:
        return np.zeros(len(c))
    return np.where(c.etp == 1, m.moe_layers / m.layers, 0.0)
