"""Predicted seconds of one training step for many layouts at once, with its breakdown.

For the busiest pipeline rank (of the ranks that can be: :func:`shardlab.plan.stages.
timed_ranks`, with uneven stages, the embedding on rank 0 and the head with the last
chunk) and m micro-batches of b sequences of s tokens (T = b·s/cp tokens each on a
context-parallel rank), on devices of dense peak P (:class:`Device`):

* **compute**: m · 3 · (forward of the rank's layers + the head on the last rank),
  backward = 2 x forward (Narayanan et al. 2021). Each matmul [T, K] x [K, N/t] is
  timed at P times the accelerator's efficiency curve at its own shape
  (:mod:`shardlab.plan.efficiency`); the attention core 4·T·s·q/t FLOPs (the full
  s x s, Megatron's convention; a cp rank's s/cp queries against all s keys, times the
  causal load balance of :func:`shardlab.estimate.context.causal_imbalance`, 1 with the
  zigzag chunks) at the shape [s/cp, head_dim] x [head_dim, s], or with a
  fused (flash) kernel, which keeps the scores on chip, at intensity s/(cp + 1) (Q, O of
  s/cp tokens and K, V of s read and written once: Dao et al. 2022; s/2 without cp), no
  faster than its authors' measured share of the peak (``flash_kernel``: FlashAttention-2
  35% of an H100, FlashAttention-3 75%, llm-foundry's Triton kernel FlashAttention-2's share
  over 2.26, an fp8 kernel 61% of the fp8 peak: :data:`shardlab.config.hardware.
  H100_EFFICIENCY`); plus a fixed cost per
  operator launch (12 per layer forward, twice that backward; a MoE layer 9 + 2 + 5, or
  9 + 2 per local expert + 5 where the framework launches each expert's GEMMs apart)
  (:mod:`shardlab.plan.layer_time`). The full s x s stays priced although a causal fused
  kernel skips the masked half: halving it was tried and left torchtitan's runs 8-15%
  fast (docs/validation.md).
* **loss** (part of compute, last stage): the cross-entropy over the rank's T x V/t logits,
  forward and backward, ``loss_bytes`` per logit at the memory bandwidth (the framework's
  implementation: :attr:`shardlab.plan.overlap.Framework.loss_bytes`).
* **memory-bound operators** (part of compute): the norms, residual adds, rotary
  embedding, activation and (without a fused attention kernel) the softmax over the
  s x s scores move bytes, not FLOPs: their forward bytes are those of
  :func:`shardlab.estimate.operators.layer_operators` (each reads its inputs and
  writes its output), per tensor-parallel rank (norms and adds on T·h, or T·h/t with
  sequence parallelism; the rest split t ways), timed at the memory bandwidth
  (roofline: Williams et al. 2009); backward moves twice the forward's bytes. A MoE
  layer also permutes its tokens to their experts and back, (3R + T)·h elements each way
  (:func:`shardlab.plan.memory_bound.permute_seconds`).
* **gradient accumulation** (part of compute, with ``fused_accumulation`` off: eager
  torch, or a run's ``fused_accumulation=0``): each micro-batch after the first adds its
  gradients into the held ones, 3 x the rank's gradient bytes (read both, write one) at
  the memory bandwidth. Megatron fuses the add into the weight-gradient matmul unless a
  run states ``--no-gradient-accumulation-fusion`` (its functional tests, Megatron-FSDP
  recipes), so most published Megatron runs pay nothing for it.
* **recompute**: the hardware FLOPs beyond the model's (a fused kernel's backward
  recomputing half its core in every mode): selective, the attention core's forward with
  its softmax's bytes or Megatron's ``recompute_modules`` (:func:`shardlab.plan.
  memory_bound.selective_seconds`), or with ``selective="op"`` (torchtitan) every second
  linear matmul (:func:`shardlab.plan.layer_time.op_checkpoint_matmuls`) with its fp8
  casts and the memory-bound operators; full, every layer's forward.
* **offload** (``offload_layers``): host copies beyond their window (:mod:`shardlab.plan.
  offload`).
* **tp_comm**: per layer and micro-batch four all-reduces of T·h activations (six with
  full recompute; sequence parallel's all-gather + reduce-scatter pairs cost the
  same), one more on the first and on the last stage (vocabulary-parallel embedding
  and head) (Shoeybi et al. 2019; Korthikanti et al. 2022), on the critical path unless
  ``overlap_tp`` hides each of the four (sequence parallel's two all-gathers and two
  reduce-scatters) beside its own matmul (:func:`shardlab.plan.overlap.tp_exposed`). With
  ``selective="op"`` and sequence parallelism the recompute gathers the attention's and
  the MLP's inputs again: one all-reduce's time more. A MoE layer whose experts are whole
  (etp 1), with no shared expert, runs no collective around its MLP where the framework
  routes each tensor rank's own sequence-parallel tokens (``moe_sequence_split``:
  Megatron-LM, :func:`moe_split_share`): its two MLP windows carry nothing.
* **cp_comm** (context parallel, cp > 1): per layer and micro-batch an all-gather of the
  rank's K and V forward (again under full recompute) and the reduce-scatter of their
  gradients backward, (cp-1)·b·(s/cp)·2·kv_dim/t·e bytes each ((kv_dim + v_dim) under
  latent attention)
  (:func:`shardlab.estimate.context.kv_gather_bytes`; Llama 3, Dubey et al. 2024,
  Sec. 3.3.2), each call (cp-1)·α + bytes/B, on the critical path (attention waits for
  its keys). The cp group spans cp·t consecutive ranks (rank order tp innermost, then
  cp, dp, pp: Megatron-LM's and torchtitan's meshes): inside a node while cp·t <= devices
  per node.
* **pp_comm**: 2·v·m point-to-point messages of T·h/t activations per rank
  (Narayanan et al. 2021's scatter/gather), exposed but what ``overlap_pp`` hides
  (Megatron-LM's: not the warmup's and flush's, :func:`~shardlab.plan.overlap.pp_unhidden`).
* **ep_comm** (mixture of experts, ep > 1): per MoE layer and micro-batch a dispatch
  and a combine all-to-all forward, both again backward (and forward again under full
  recompute), each rank sending (ep-1)/ep of its T·k kept rows of h activations
  (:func:`shardlab.estimate.expert.expert_alltoall_bytes`; GShard, Lepikhin et al.
  2020), each call (ep-1)·α + bytes/B (pairwise exchange, Thakur et al. 2005), on the
  critical path (Megatron-LM's all-to-all dispatcher waits for it); with the ``flex``
  dispatcher (DeepEP) each token crosses once per rank its experts lie on, T·D rows
  (:mod:`shardlab.plan.expert_time`, ``dispatcher`` and ``routing``). The ep group spans
  ep·etp consecutive ranks (expert tensor innermost, then ep; with etp = 1 the tensor
  ranks are part of the ep group, as Megatron-LM's expert mesh and torchtitan place them):
  inside a node while ep·etp <= devices per node, else the rows for other nodes on the
  network and the rest on NVLink at once. The routed experts' matmuls: the rank's E/ep
  experts, each on the rows it receives (ep·T·k/E, capped by capacity), at width f/etp.
* **bubble**: the schedule's idle ratio (:mod:`shardlab.plan.bubble`) times the
  busiest rank's busy time per step (compute + recompute + tp_comm + ep_comm +
  cp_comm): with unequal stages the slowest one sets the pipeline's pace.
* **dp_comm** (exposed part only): the data-parallel and ZeRO collectives
  (:mod:`shardlab.plan.dp_time`): ZeRO-0 all-reduces the gradients, ZeRO-1/2
  reduce-scatter them and all-gather the weights, ZeRO-3 gathers every micro-batch's
  weights forward and backward; what ``overlap_dp`` cannot hide behind the last
  micro-batch's backward and the first one's forward is exposed.
* **optimizer**: Adam reads and writes the rank's weights, gradients and optimizer
  state (its ZeRO shard): 2·(w + g + o)·Ψ/N bytes at the memory bandwidth (N the shard
  group, dp_shard x cp; experts' shard over theirs).
* **overhead** (this machine only, 0 for a catalog accelerator): what the runtime costs
  besides arithmetic and bytes, measured by ``shardlab hardware --measure``
  (:mod:`shardlab.calibrate.runtime`): the eager base (``ddp``'s fit) plus, for each
  parallel style the layout uses (FSDP / ZeRO >= 1, tensor, pipeline), what that
  style's measured fit adds to the base, at the timed rank's layers and micro-batches.
  With these measured, each collective is timed at gloo's own fitted bandwidth for it
  (all-reduce, all-gather, reduce-scatter, send) without its latency, which the tiny
  runs already hold, and the per-operator launch cost above is not charged again.

Step = the sum of the ten; MFU = model FLOPs of the step (3 x forward, logits
counted, full s x s attention; per token the same with cp) / (step x devices x P), devices
= dp x cp x tp x pp (PaLM, Chowdhery et al. 2022).
"""

from __future__ import annotations

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import RECOMPUTE
from shardlab.config.model import ModelShape
from shardlab.estimate.flops import flops_per_token
from shardlab.plan import expert_time as ex
from shardlab.plan.bubble import bubble_ratios
from shardlab.plan.comm_time import (
    allreduce_seconds,
    gather_seconds,
    members_per_node,
    send_seconds,
)
from shardlab.plan.dp_time import dp_seconds
from shardlab.plan.efficiency import matmul_seconds
from shardlab.plan.layer_time import cp_balance, layer_forward
from shardlab.plan.memory import MemoryArrays
from shardlab.plan.memory_bound import (
    fp8_cast_seconds,
    layer_elementwise_elements,
    permute_seconds,
    selective_seconds,
)
from shardlab.plan.offload import offload_seconds
from shardlab.plan.overlap import pp_exposed, tp_exposed
from shardlab.plan.space import Candidates
from shardlab.plan.stages import timed_ranks
from shardlab.plan.step_inputs import Device, StepOptions, runtime_overhead

PARTS: tuple[str, ...] = ("compute", "recompute", "tp_comm", "pp_comm", "ep_comm", "cp_comm",
                          "dp_comm", "bubble", "optimizer", "overhead", "offload")
HIDDEN: tuple[str, ...] = ("tp_comm", "pp_comm", "ep_comm", "dp_comm", "offload")
"""The communication parts that overlap may hide: ``hidden_<part>`` seconds beside each."""
DEFAULT_OPTIONS = StepOptions()
"""The step-time model's options when none are given (a fused kernel, dp overlap)."""


def step_seconds(model: ModelShape, c: Candidates, mem: MemoryArrays, seq: int,
                 global_batch: int, policy: DtypePolicy, dev: Device,
                 opt: StepOptions = DEFAULT_OPTIONS) -> dict[str, np.ndarray]:
    """Seconds per step of every layout in ``c``, by part (module docstring), with ``step``,
    ``mfu``, ``stage`` (the rank timed) and ``hidden_<part>`` for each part of
    :data:`HIDDEN` (communication seconds overlapped with compute, not in ``step``)."""
    m = model
    tp, pp, v, mb, cp = c.tp, c.pp, c.virtual, c.micro_batch, c.cp
    micro = c.microbatches.astype(float)
    rc = c.recompute
    full = rc == RECOMPUTE.index("full")
    balance = cp_balance(seq, cp)
    # One layer's forward, averaged over dense and MoE layers (dense ones first in the model).
    dense_l = layer_forward(m, seq, tp, mb, dev, moe_layer=False, flash=opt.flash,
                            kernel=opt.flash_kernel, cp=cp, balance=balance)
    mat_l, core_l, redo_l = dense_l.matmul, dense_l.core, dense_l.op_recompute
    up_l = dense_l.up_proj  # the same in every layer: attention is
    windows = dense_l.tp_windows
    if m.moe_layers:
        moe_l = layer_forward(m, seq, tp, mb, dev, moe_layer=True, c=c, flash=opt.flash,
                              kernel=opt.flash_kernel, cp=cp, balance=balance,
                              expert_launches=opt.expert_launches)
        w = m.moe_layers / m.layers
        mat_l, core_l, redo_l = ((1 - w) * a + w * b for a, b in (
            (mat_l, moe_l.matmul), (core_l, moe_l.core), (redo_l, moe_l.op_recompute)))
        windows = tuple((1 - w) * a + w * b for a, b in zip(windows, moe_l.tp_windows,
                                                             strict=True))
    # Memory-bound operators at the memory bandwidth (bytes = elements x activation bytes).
    ew_elems, soft_elems = layer_elementwise_elements(m, seq, tp, mb, c.sp, opt.flash,
                                                      opt.fused_norm, cp)
    ew_bw = dev.elementwise_bandwidth or dev.memory_bandwidth
    ew_l = ew_elems * policy.activation_bytes / ew_bw
    soft_l = soft_elems * policy.activation_bytes / ew_bw
    fwd_layer = mat_l + core_l + ew_l
    # fp8: each layer's casts, forward (again under full recompute) and backward.
    cast_f, cast_b = (fp8_cast_seconds(m, c, seq, ew_bw, opt.fp8_cast_bytes) if policy.is_fp8
                      else (np.zeros(len(c)), np.zeros(len(c))))
    # A MoE layer's token permutation and unpermutation, each way (memory_bound), beside them.
    perm = permute_seconds(m, c, seq, policy.activation_bytes, ew_bw)
    cast_f, cast_b = cast_f + perm, cast_b + perm
    tokens = mb * seq / cp  # a context-parallel rank's tokens of a micro-batch
    # The head, and for each multi-token-prediction depth its projection (2h to h/t) and the
    # head again (DeepSeek-V3 Sec. 2.2); the depths' blocks are among the layers.
    heads = 1 + m.mtp_layers
    head = heads * matmul_seconds(2.0 * tokens * m.d_model * m.vocab / tp, tokens, m.d_model,
                                  m.vocab / tp, dev.peak, dev.eff) + m.mtp_layers * (
        matmul_seconds(2.0 * tokens * 2 * m.d_model * m.d_model / tp, tokens, 2 * m.d_model,
                       m.d_model / tp, dev.peak, dev.eff))
    # The loss over the rank's T x V/t logits (each head's), forward and backward,
    # memory-bound.
    loss = heads * tokens * m.vocab / tp * opt.loss_bytes / ew_bw
    # Hardware FLOPs beyond the model's, per layer forward (a fused kernel's backward
    # recomputes half its core). Selective: the attention core (Korthikanti et al. 2022) or
    # Megatron's modules, or per operator (torchtitan) every second linear matmul with its
    # fp8 casts and the memory-bound operators, the attention's output saved.
    selective, flash_redo = rc == RECOMPUTE.index("selective"), core_l / 2 if opt.flash else 0.0
    by_op = opt.selective == "op"
    sel_extra = (redo_l + ew_l + flash_redo + cast_f * redo_l / mat_l if by_op
                 else flash_redo + selective_seconds(core_l + soft_l, m, c, seq,
                                                     opt.recompute_modules,
                                                     policy.activation_bytes, ew_bw))
    if not by_op:
        # Megatron-Core's mla_up_proj (every layer's up projections again) and mlp (a dense
        # layer's MLP again: its matmuls and activation), averaged over the layers.
        mods = opt.recompute_modules
        dense_mlp = (dense_l.tp_windows[2] + dense_l.tp_windows[3]
                     + m.mlp_matrices * tokens * m.d_ff / tp * policy.activation_bytes / ew_bw)
        sel_extra = (sel_extra + (up_l if "mla_up_proj" in mods else 0.0)
                     + (m.dense_layers / m.layers * dense_mlp if "mlp" in mods else 0.0))
        if "moe" in mods and m.moe_layers:
            # A MoE layer again: its experts' and shared experts' matmuls, the experts'
            # activation (already above where moe_act is named too) and the permutation
            # (its all-to-alls: below).
            act = () if "moe_act" in mods else ("moe_act",)
            sel_extra = sel_extra + (m.moe_layers / m.layers * (
                moe_l.tp_windows[2] + moe_l.tp_windows[3]) + perm + selective_seconds(
                    np.zeros(len(c)), m, c, seq, act, policy.activation_bytes, ew_bw))
    extra_layer = np.select([selective, full], [sel_extra, fwd_layer + cast_f], flash_redo)
    # Tensor-parallel all-reduces of T·h activations: 2 per layer forward, 2 backward and 2
    # more with full recompute; exposed as overlap_tp leaves them (overlap module).
    act_bytes = tokens * m.d_model * policy.activation_bytes
    gpn = dev.gpus_per_node
    lat, bw = dev.link("all_reduce", tp <= gpn, members_per_node(tp, 1, gpn))
    one_ar = allreduce_seconds(act_bytes, tp, lat, bw)
    # Per-operator checkpointing with sequence parallelism gathers the attention's and the
    # MLP's inputs again (its policy saves reduce-scatter outputs, not all-gathers): two
    # all-gathers, one all-reduce's time.
    again = np.select([full, selective & c.sp & by_op], [2.0, 1.0], 0.0)
    # The share of layers whose MLP has its two collectives (moe_split_share: the rest).
    mlp_share = 1.0 - ex.moe_split_share(m, c, opt.moe_sequence_split)
    # Each collective (half an all-reduce) rides only beside its own matmul (windows).
    tp_all = (2.0 + 2.0 * mlp_share + again * (1.0 + mlp_share) / 2) * one_ar
    half = one_ar / 2
    tp_shown = sum(tp_exposed(half * s, half * s, g, tp, opt.overlap_tp)
                   + tp_exposed(again * half * s / 2, 0.0, np.where(full, g, redo_l / 4), tp,
                                opt.overlap_tp)
                   for g, s in zip(windows, (1.0, 1.0, mlp_share, mlp_share), strict=True))

    # Expert-parallel all-to-alls per layer (averaged over dense and MoE layers, as above),
    # over NVLink and, for a group across nodes, the network at once (ep_members_per_node).
    nvl, net = (dev.link("all_to_all", np.full(len(c), x)) for x in (True, False))
    per_layer_a2a = ex.alltoall_layer_seconds(m, c, seq, policy, *nvl, opt.dispatcher, opt.routing,
                                              net, ex.ep_members_per_node(c, cp, gpn))
    if "moe" in opt.recompute_modules and not by_op:
        # A recomputed MoE layer dispatches and combines once more: 3 passes, not 2.
        per_layer_a2a = np.where(selective, 1.5, 1.0) * per_layer_a2a

    # Context parallel: per layer and micro-batch the K/V all-gathers forward (twice under
    # full recompute) and the reduce-scatter of their gradients backward, each of the
    # whole b·s·2·kv_dim/t K and V: (cp-1)α + (cp-1)/cp·n/B. torch's ring under torchtitan
    # (cp_expanded_kv): K/V of every query head, gathered again backward, fp32 gradients.
    kv_bytes = (mb * seq * ((m.q_dim + m.o_dim) if opt.cp_expanded_kv else (m.kv_dim + m.v_dim))
                / tp * policy.activation_bytes)
    link_cp = dev.link("all_gather", cp * tp <= gpn, members_per_node(cp, tp, gpn))
    one_kv = gather_seconds(kv_bytes, cp, *link_cp)
    per_layer_cp = np.where(full, 3.0, 2.0) * one_kv + (gather_seconds(
        kv_bytes * 4 / policy.activation_bytes, cp, *link_cp) if opt.cp_expanded_kv else 0.0)

    # The ranks that can be the busiest: their layers, embedding and head.
    layers, emb, with_head, rank = timed_ranks(m.layers, pp, v, c.split, c.splits, c.schedule)
    col = lambda x: np.asarray(x, float)[:, None]  # noqa: E731 - one layout per row
    comp_r = (3 * (layers * col(fwd_layer) + with_head * col(head))
              + layers * col(cast_f + cast_b) + with_head * col(loss))
    rec_r = layers * col(extra_layer)
    ends = emb + with_head  # vocabulary-parallel embedding and head: one all-reduce each
    tp_r = layers * col(tp_shown) + ends * col(one_ar)
    ep_r, cp_r = layers * col(per_layer_a2a), layers * col(per_layer_cp)
    pick = np.argmax(comp_r + rec_r + tp_r + ep_r + cp_r, axis=1)
    rows = np.arange(len(c))
    comp_mb, rec_mb, tp_mb, ep_mb, cp_mb = (x[rows, pick]
                                            for x in (comp_r, rec_r, tp_r, ep_r, cp_r))
    tp_all_mb = (layers * col(tp_all) + ends * col(one_ar))[rows, pick]

    # Gradient accumulation in eager torch: every micro-batch after the first adds its
    # gradients into the held ones (read both, write one: 3 x the rank's gradient bytes).
    accumulate = 0.0 if opt.fused_accumulation else (
        (micro - 1) * 3 * mem.params * policy.grad_bytes / dev.memory_bandwidth)
    # EP overlap (overlap_ep): the all-to-alls of paired micro-batches beside each other's
    # compute, which their SMs slow (expert_time.ep_overlap).
    ep_comm, ep_hidden, ep_slow = ex.ep_overlap(micro * ep_mb, micro * comp_mb, c,
                                                opt.overlap_ep)
    compute, recompute, tp_comm, cp_comm = (micro * comp_mb + accumulate + ep_slow,
                                            micro * rec_mb, micro * tp_mb, micro * cp_mb)
    busy_mb = comp_mb + rec_mb + tp_mb + (ep_comm + ep_slow) / micro + cp_mb
    bubble = bubble_ratios(c.schedule, pp, c.microbatches, v) * micro * busy_mb

    # Point-to-point: 2·v messages per micro-batch of T·h/t activations.
    message = send_seconds(act_bytes / tp, *dev.link("send", c.gpus <= dev.gpus_per_node))
    messages = np.where(pp > 1, 2 * v * micro, 0.0)
    pp_comm = pp_exposed(message, messages, comp_mb / (3 * v), opt.overlap_pp, pp, v, micro)

    units = layers.max(axis=1).astype(float)
    dpt = dp_seconds(c, mem, policy, dev, opt, units, micro, comp_mb, rec_mb, tp_mb, cp_mb,
                     ep_comm)
    dp_comm, dp_all = dpt.exposed, dpt.total
    shard = np.where(c.zero >= 1, dpt.group, 1).astype(float)
    expert_shard = np.where(c.zero >= 1, dpt.expert_group, 1).astype(float)
    optimizer = 2.0 * policy.state_bytes * ((mem.params - mem.expert_params) / shard
                                            + mem.expert_params / expert_shard
                                            ) / dev.memory_bandwidth

    overhead = (runtime_overhead(dev.runtime, c, micro, units)
                if dev.runtime is not None else np.zeros(len(c)))
    # offload_layers: activations to the host and back beside each layer's compute.
    off, off_hidden = offload_seconds(mem.offloaded, opt.offload_layers, m.layers,
                                      fwd_layer + cast_f, 2 * fwd_layer + cast_b,
                                      dev.host_link, dev.eff.link_fraction)
    parts = {"compute": compute, "recompute": recompute, "tp_comm": tp_comm,
             "pp_comm": pp_comm, "ep_comm": ep_comm, "cp_comm": cp_comm, "dp_comm": dp_comm,
             "bubble": bubble, "optimizer": optimizer, "overhead": overhead,
             "offload": micro * off}
    step = sum(parts.values())
    # Model FLOPs: the work done (a capacity factor's dropped assignments are not).
    model_flops = (flops_per_token(m, seq).train - ex.dropped_train_flops(m, c, seq)) * (
        global_batch * seq)
    gpus = c.gpus.astype(float)
    return {**parts, "step": step, "mfu": model_flops / (step * gpus * dev.peak),
            "stage": rank[rows, pick],
            "hidden_tp_comm": micro * tp_all_mb - tp_comm,
            "hidden_pp_comm": messages * message - pp_comm, "hidden_dp_comm": dp_all - dp_comm,
            "hidden_ep_comm": ep_hidden, "hidden_offload": micro * off_hidden}
