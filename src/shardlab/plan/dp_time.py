"""Data-parallel and ZeRO communication in the step-time model
(:mod:`shardlab.plan.step_time`'s ``dp_comm``): what is exposed beyond the windows it can
hide behind, and all of it.

ZeRO-0 all-reduces the gradients, ZeRO-1/2 reduce-scatter them and all-gather the updated
weights, ZeRO-3 all-gathers the weights in every micro-batch's forward and backward and
reduce-scatters the gradients (ZeRO paper, Rajbhandari et al. 2020; bytes as
:func:`shardlab.estimate.comm.dp_bytes_per_step`; a MoE rank's routed experts over
expert_dp = dp/ep ranks, the rest over dp:
:func:`~shardlab.estimate.comm.layout_dp_bytes`), one gather per layer, so each layer adds
the ring's latency (FSDP wraps every block). A ring with k members per node leaves it over
k NICs (:func:`~shardlab.plan.comm_time.members_per_node`; cp's too) and pays the network's
latency on one step in k, NVLink's on the others. ZeRO-3 pays a ring's latency per layer
for its gather and its reduce-scatter; in the backward a layer's gather and the previous
layer's reduce-scatter share the group's communicator, so they queue one after the other
and hide together (Megatron-LM's MFSDP runtime_schedule.md: "When AG and RS share a NCCL
communicator, the communicator enforces the host-side launch order even if the operations
use independent CUDA streams"), and where the framework reduce-scatters after every
micro-batch (``reduce_each_micro``: PyTorch FSDP without ``no_sync``) they do so in every
micro-batch without a pipeline; in torch.distributed.pipelining's stages the same FSDP
gathers once (behind the first micro-batch's forward) and reduce-scatters once, exposed,
after the stage's last backward (``perform_reduce_grad``). ZeRO shards over dp_shard x cp
(the cp ranks hold the same weights; torchtitan's ``dp_shard_cp``), gradients are summed
over dp x cp; HSDP (dp_replicate R > 1) reduce-scatters and gathers inside the shard group
(its link: dp_shard·cp·t consecutive ranks) and all-reduces each rank's shard of the
gradients across the R replicas (the link of dp·cp·t ranks), behind the same backward
window. With ``overlap_dp`` the gradient reduction hides behind the last micro-batch's
backward and the weight gather behind the first micro-batch's forward (Megatron's
overlap-grad-reduce and overlap-param-gather; FSDP's prefetch); what is longer than that
window is exposed. A ring that leaves the node runs on its own stream over the network, so
its window also holds the time the compute stream waits on a tensor-, expert- or
context-parallel collective that stays on NVLink (a third of it forward, two thirds
backward, as the compute).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.plan.comm_time import allreduce_seconds, gather_seconds, members_per_node
from shardlab.plan.memory import MemoryArrays, zero_group_arrays
from shardlab.plan.overlap import dp_on, hidden_behind, nvlink_waits
from shardlab.plan.space import Candidates
from shardlab.plan.step_inputs import Device, StepOptions


@dataclass(frozen=True)
class DpTime:
    """Per layout: the exposed data-parallel seconds per step (``exposed``), all of them
    (``total``), and the dense and the expert parameters' ZeRO shard groups (``group``,
    ``expert_group``)."""

    exposed: np.ndarray
    total: np.ndarray
    group: np.ndarray
    expert_group: np.ndarray


def dp_seconds(c: Candidates, mem: MemoryArrays, policy: DtypePolicy, dev: Device,
               opt: StepOptions, units: np.ndarray, micro: np.ndarray, comp_mb: np.ndarray,
               rec_mb: np.ndarray, tp_mb: np.ndarray, cp_mb: np.ndarray,
               ep_comm: np.ndarray) -> DpTime:
    """The data-parallel communication of every layout in ``c`` (module docstring): the
    timed rank's ``units`` layers (ZeRO-3 gathers them one by one), ``micro``
    micro-batches, and per micro-batch its compute, recompute, tensor- and context-parallel
    seconds; ``ep_comm`` its expert all-to-alls per step (their NVLink waits widen a ring's
    window)."""
    tp, cp, dp, pp, gpn = c.tp, c.cp, c.dp, c.pp, dev.gpus_per_node
    # Data parallel / ZeRO: exposed beyond the windows it can hide behind. Dense parameters
    # shard over dp_shard x cp, routed experts over theirs (zero_group_arrays); the shard
    # group spans dp_shard·cp·t consecutive ranks, HSDP's replicas (and DDP's all-reduce
    # over dp x cp) dp·cp·t.
    group, egroup, reps, ereps = zero_group_arrays(c)
    inside_d, inside_r = tp * group <= dev.gpus_per_node, tp * cp * dp <= dev.gpus_per_node
    dense = mem.params - mem.expert_params
    on = dp_on(opt.overlap_dp, c.zero)
    # A ring that leaves the node also hides behind the waits on NVLink collectives.
    ep_span = c.ep * c.etp * (1 if c.fold else cp)  # a folded mesh has no cp rank inside
    nvlink = nvlink_waits((tp_mb, tp <= gpn), (ep_comm / micro, ep_span <= gpn),
                          (cp_mb, cp * tp <= gpn),
                          dp_inside=np.where(c.zero == 0, inside_r, inside_d))
    fwd_window = (comp_mb + nvlink) / 3
    bwd_window = 2 * (comp_mb + nvlink) / 3 + rec_mb
    z = c.zero

    reduce_bytes = (opt.grad_reduce_bytes if opt.grad_reduce_bytes and policy.compute == "bf16"
                    else policy.grad_bytes)
    # A ring leaves each node through the NICs of the group's members there (comm_time):
    # dense groups stride t (HSDP's replicas t·dp_shard·cp), expert groups ep·etp(·cp).
    def over(collective: str, fn: Callable[..., np.ndarray], nbytes: float,
             ranks: np.ndarray, expert_ranks: np.ndarray, inside: np.ndarray,
             per: tuple[np.ndarray, np.ndarray] = (np.ones(1), np.ones(1)),
             stride: np.ndarray = tp) -> np.ndarray:
        """``fn`` of the dense and the expert parameters' ``nbytes`` per element (divided by
        ``per``) over their groups of ``ranks`` and ``expert_ranks``."""
        link = dev.link(collective, inside, members_per_node(ranks, stride, gpn))
        elink = dev.link(collective, inside, members_per_node(
            expert_ranks, stride * ep_span // np.maximum(tp, 1), gpn))
        experts = fn(mem.expert_params * nbytes / per[1], expert_ranks, *elink)
        # A dense model has no expert collective to pay the latency of.
        return (fn(dense * nbytes / per[0], ranks, *link)
                + np.where(mem.expert_params > 0, experts, 0.0))

    ar = over("all_reduce", allreduce_seconds, reduce_bytes, group * reps, egroup * ereps,
              inside_r)
    rs = over("reduce_scatter", gather_seconds, reduce_bytes, group, egroup, inside_d)
    # HSDP: each rank's shard of the gradients all-reduced across the replicas.
    ar_rep = over("all_reduce", allreduce_seconds, reduce_bytes, reps, ereps, inside_r,
                  (group.astype(float), egroup.astype(float)), tp * group)
    lat_d, _ = dev.link("all_gather", inside_d, members_per_node(group, tp, gpn))
    # The distributed optimizer's parameter all-gather, in fp8 with fp8 primary weights.
    ag = over("all_gather", gather_seconds, (opt.fp8_params and policy.gather_bytes)
              or policy.weight_bytes, group, egroup, inside_d)
    # ZeRO-3/FSDP gathers and reduce-scatters layer by layer (one unit per block): each pays
    # the ring's latency; fp8 gathers the linear weights in fp8 (gather_bytes).
    per_unit = np.where(group > 1, units * (group - 1) * lat_d, 0.0)
    ag3 = over("all_gather", gather_seconds, policy.gather_bytes or policy.weight_bytes,
               group, egroup, inside_d) + per_unit

    def hide(comm: np.ndarray, window: np.ndarray) -> np.ndarray:
        return hidden_behind(comm, window, units, on)

    # ZeRO-3: weights gathered in every micro-batch's forward and backward; a backward
    # gather and the previous layer's reduce-scatter share the group's one NCCL stream
    # (ProcessGroupNCCL), so they hide together, HSDP's replica all-reduce on its own group;
    # gradients reduced once (the last micro-batch) or, with reduce_each_micro and no
    # pipeline (its stages skip the sync), every time. FSDP1's backward_prefetch=post
    # gathers a layer only after the next one's backward: those gathers wait, unhidden.
    each = (z == 3) & (pp == 1) & opt.reduce_each_micro
    syncs = np.where(each, micro, 1.0)
    rs3 = rs + per_unit
    post = opt.backward_prefetch == "post"
    bwd_ag = ag3 if post else hide(ag3, bwd_window)
    last = ag3 + hide(rs3, bwd_window) if post else hide(ag3 + rs3, bwd_window)
    zero3 = (micro * hide(ag3, fwd_window) + (micro - syncs) * bwd_ag
             + syncs * (last + hide(ar_rep, bwd_window)))
    # PyTorch FSDP in torch.distributed.pipelining's stages (torchtitan, shardlab train):
    # the stage keeps its units gathered from the first micro-batch's forward to the last
    # one's backward (torchtitan reshards none after forward with pp; the stage sets
    # reshard_after_backward False but in the last), so it gathers once, behind the first
    # forward; its gradients are reduce-scattered once, by the schedule's REDUCE_GRAD after
    # the stage's last backward (torch/distributed/pipelining/stage.py perform_reduce_grad,
    # "Manually call post backward for FSDP", whose _root_post_backward_final_callback makes
    # the compute stream wait for them): no compute is left to hide them behind.
    piped = (pp > 1) & (z >= 2) & opt.reduce_each_micro
    dp_comm = np.select(
        [z == 0, piped, z <= 2],
        [hide(ar, bwd_window), hide(ag3, fwd_window) + rs3 + ar_rep,
         hide(rs + ar_rep, bwd_window) + hide(ag, fwd_window)], zero3)
    dp_all = np.select([z == 0, piped, z <= 2], [ar, ag3 + rs3 + ar_rep, rs + ar_rep + ag],
                       2 * micro * ag3 + syncs * (rs3 + ar_rep))

    return DpTime(dp_comm, dp_all, group, egroup)
