"""The whole budget of one model on one layout and accelerator, as one JSON-ready document.

Every figure is in base units (bytes, FLOPs, seconds, FLOP/s); the human view and
the reports format them. Field names are shared with measured results, so a
"predicted vs measured" table is a join on names. A mixture-of-experts model adds a
``moe`` section (expert parallelism, capacity, routed tokens and activations,
all-to-all bytes: :mod:`shardlab.estimate.expert`) and ``comm.ep_bytes_per_step``. A
context-parallel layout (cp > 1) adds a ``cp`` section (chunks, K/V all-gather bytes
forward and backward, gathered K/V kept, the causal load balance:
:mod:`shardlab.estimate.context`) and ``comm.cp_bytes_per_step``, its own kind.

Links follow the rank order tp (innermost), then cp, then dp (dp_shard, then
dp_replicate under HSDP), then pp, as Megatron-LM and torchtitan build their meshes: a
group stays inside a node while the span of consecutive ranks it covers does (tp: t;
cp: cp·t; the ZeRO shard group: dp_shard·cp·t; HSDP's replicas and DDP's all-reduce:
dp·cp·t).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.hardware import Accelerator, matmul_peaks
from shardlab.config.layout import Layout
from shardlab.config.model import ModelShape, served
from shardlab.errors import SpecError
from shardlab.estimate import fp8
from shardlab.estimate.budget_sections import alltoall_calls, cp_seconds, cp_section, moe_section
from shardlab.estimate.comm import (
    alltoall_seconds,
    dp_bytes_per_step,
    embedding_sync_bytes,
    layout_dp_bytes,
    pp_bytes_per_rank,
    ring_allreduce_seconds,
    tp_bytes_per_stage,
)
from shardlab.estimate.context import (
    cp_bytes_per_step,
)
from shardlab.estimate.expert import (
    ep_members_per_node,
    expert_alltoall_bytes,
    moe_flops_per_token,
    rank_params_split,
)
from shardlab.estimate.flops import flops_per_token, train_flops_6nd
from shardlab.estimate.inference import (
    decode_step,
    kv_bytes_per_token,
    max_decode_batch,
    prefill_step,
)
from shardlab.estimate.memory import layer_bytes, peak_stage, stage_memory
from shardlab.estimate.operators import layer_operators
from shardlab.estimate.params import count_params
from shardlab.estimate.partition import layout_chunk_layers, layout_rank_layers
from shardlab.estimate.roofline import Roofline
from shardlab.estimate.states import split_state_bytes, zero_groups, zero_state_bytes
from shardlab.estimate.timing import train_time

CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal D ≈ 20 N


@dataclass(frozen=True)
class Assumptions:
    """What the budget cannot know and takes as given; printed with every answer."""

    mfu: float = 0.4
    tokens: float | None = None  # None: 20 tokens per parameter
    price_per_gpu_hour: float = 2.0
    causal: bool = False
    # "flash" (as plan and today's real runs): a fused kernel that keeps no s x s matrices;
    # "eager": the s x s scores are kept (Korthikanti et al. 2022's counts).
    attention: str = "flash"
    dropout: bool | None = None  # None: the model style's habit (gpt yes, llama no)
    decode_batch: int = 1
    decode_context: int | None = None  # None: the model's context
    routing_imbalance: float = 1.0  # max/mean tokens per expert; 1: balanced routing


def _roof(r: Roofline) -> dict[str, Any]:
    return {"seconds": r.seconds, "bound": r.bound, "flops": r.flops, "bytes": r.bytes,
            "t_compute": r.t_compute, "t_memory": r.t_memory, "intensity": r.intensity}


def _states(params: float, policy: DtypePolicy, dp: int, experts: float = 0.0,
            expert_dp: int = 1) -> dict[str, dict[str, float]]:
    out = {}
    for z in range(4):
        s = (split_state_bytes(params, experts, policy, z, dp, expert_dp) if experts
             else zero_state_bytes(params, policy, z, dp))
        out[str(z)] = {"weights": s.weights, "gradients": s.gradients, "optimizer": s.optimizer,
                       "total": s.total}
    return out


def effective_peak(acc: Accelerator, policy: DtypePolicy, share: float) -> float:
    """The dense peak (FLOP/s) the budget's MFU applies to: the compute dtype's, or with fp8
    the blend of ``share`` of the FLOPs (the linear layers) at the fp8 peak and the rest at
    the compute dtype's (:func:`shardlab.estimate.fp8.blended_peak`). SpecError for a
    dtype the accelerator has no peak for (fp8 on an A100)."""
    peak, linear = matmul_peaks(acc, policy.compute, policy.linear_compute)
    return fp8.blended_peak(peak, linear, share) if policy.is_fp8 else peak


def _time(flops: float, tokens_per_step: float, per_step: float, gpus: int, acc: Accelerator,
          policy: DtypePolicy, a: Assumptions, hardware_ratio: float,
          share: float = 1.0) -> dict[str, Any]:
    if a.mfu * hardware_ratio > 1:
        raise SpecError("mfu", a.mfu, f"means an HFU of {a.mfu * hardware_ratio:.1%}: this "
                        f"recompute and attention make the hardware do {hardware_ratio:.3f}x "
                        f"the model FLOPs, so the MFU must be at most {1 / hardware_ratio:.3f}")
    peak = effective_peak(acc, policy, share)
    t = train_time(flops, gpus, peak, a.mfu, a.price_per_gpu_hour, acc.power_watts)
    step = per_step / (gpus * peak * a.mfu)
    # HFU counts the recomputed work too (PaLM, Chowdhery et al. 2022): MFU x hardware/model.
    return {"train_seconds": t.seconds, "train_days": t.days, "gpu_hours": t.gpu_hours,
            "cost": t.cost, "energy_kwh": t.energy_kwh, "step_seconds": step,
            "tokens_per_s": tokens_per_step / step, "mfu": a.mfu,
            "hfu": a.mfu * hardware_ratio}


def model_budget(m: ModelShape, layout: Layout, acc: Accelerator,
                 a: Assumptions = Assumptions()) -> dict[str, Any]:
    """Parameters, FLOPs, memory, time, communication, inference and operators of ``m``."""
    lay = layout
    pc = count_params(m)
    tokens = a.tokens if a.tokens is not None else CHINCHILLA_TOKENS_PER_PARAM * pc.total
    dropout = (m.style == "gpt") if a.dropout is None else a.dropout
    flash = a.attention == "flash"
    fpt = flops_per_token(m, lay.seq, lay.recompute, a.causal, flash)

    stages = stage_memory(m, lay, dropout, flash, a.routing_imbalance)
    peak = peak_stage(stages)
    capacity = acc.memory_bytes
    per_layer = layer_bytes(m, lay, m.moe_layers == m.layers, dropout, flash,
                            a.routing_imbalance)
    max_params = max(s.params for s in stages)
    # (dense, routed-expert) parameters of the rank with the most: ZeRO and the gradient
    # traffic shard them over their groups (zero_groups: dp_shard x cp, expert_dp x cp).
    dense, experts = max(rank_params_split(m, lay), key=sum)
    groups = zero_groups(lay)

    def link(span: int) -> Any:
        """The link of a group spanning ``span`` consecutive ranks (module docstring)."""
        return acc.intra_link if span <= acc.gpus_per_node else acc.inter_link

    link_tp = link(lay.tp)
    link_cp = link(lay.cp * lay.tp)
    link_dp = link(lay.dp_shard * lay.cp * lay.tp)
    link_replica = link(lay.dp * lay.cp * lay.tp)
    # The ep group spans ep·etp consecutive ranks (etp innermost, then ep; with etp = 1 the
    # tensor ranks join the ep group: Megatron-LM's expert mesh, torchtitan), strided by
    # the cp ranks between dp ranks when cp > 1.
    link_ep = link(lay.ep * lay.etp * lay.cp)
    ep_node = int(ep_members_per_node(lay.ep, lay.etp, lay.cp, acc.gpus_per_node))
    ep_link_name = (link_ep.name if ep_node == lay.ep
                    else f"{acc.intra_link.name} and {acc.inter_link.name}")
    ep_bytes = expert_alltoall_bytes(m, lay)
    cp_bytes = cp_bytes_per_step(m, lay)
    dp_inside, dp_across = layout_dp_bytes(dense, experts, lay)

    context = a.decode_context or m.context
    bp = lay.dtype.activation_bytes
    devices = lay.tp
    sm = served(m)  # serving has no multi-token-prediction depths
    decode = decode_step(sm, acc, a.decode_batch, context, devices, bp, lay.dtype.compute)
    prefill = prefill_step(sm, acc, a.decode_batch, context, devices, bp, lay.dtype.compute,
                           causal=a.causal)
    weights_bytes = count_params(sm).total * bp
    kv_cache = kv_bytes_per_token(sm, bp) * context * a.decode_batch
    infer_mem = (weights_bytes + kv_cache) / devices

    def ops(batch: int, q_len: int, kv_len: int, shape: ModelShape = m) -> list[dict[str, Any]]:
        return [{"name": o.name, "kind": o.kind, **_roof(o.roofline)}
                for o in layer_operators(shape, acc, batch, q_len, kv_len, bp,
                                         lay.dtype.compute)]

    def grad_allreduce(nbytes: float, ranks: int, lk: Any) -> float:
        return ring_allreduce_seconds(nbytes * lay.dtype.grad_bytes, ranks, lk)

    per_step = fpt.train * lay.tokens_per_step
    return {
        "model": {"name": m.name, "source": m.source, "describe": m.describe(),
                  **{k: v for k, v in asdict(m).items() if k not in ("name", "source")}},
        "layout": {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp,
                   "virtual_stages": lay.virtual_stages, "zero": lay.zero, "sp": lay.sp,
                   "micro_batch": lay.micro_batch, "global_batch": lay.global_batch,
                   "seq": lay.seq, "recompute": lay.recompute, "dtype": lay.dtype.name,
                   "schedule": lay.schedule, "gpus": lay.gpus, "ep": lay.ep, "etp": lay.etp,
                   "expert_dp": lay.expert_dp, "capacity_factor": lay.capacity_factor,
                   "cp": lay.cp, "stage_layers": list(lay.stage_layers),
                   "chunk_layers": layout_chunk_layers(m, lay),
                   "dp_replicate": lay.dp_replicate, "dp_shard": lay.dp_shard,
                   "microbatches": lay.microbatches, "tokens_per_step": lay.tokens_per_step,
                   "describe": lay.describe()},
        "hardware": _hardware(acc, lay.dtype, fp8.linear_flop_share(m, lay.seq)),
        "assumptions": {**asdict(a), "tokens": tokens, "tokens_default": a.tokens is None,
                        "dropout": dropout,
                        "decode_context": context,
                        "flops_convention": "matmuls only; logits counted; attention "
                        + ("causal-halved" if a.causal else "full s x s")},
        "params": {**pc.as_dict(), "per_device": max_params,
                   "per_device_dense": dense, "per_device_experts": experts},
        "flops": {"forward_per_token": fpt.forward, "train_per_token": fpt.train,
                  "hardware_train_per_token": fpt.hardware_train,
                  "attention_per_token": fpt.attention, "logits_per_token": fpt.logits,
                  "per_step": per_step,
                  "hardware_per_step": fpt.hardware_train * lay.tokens_per_step,
                  "train_total": fpt.train * tokens,
                  "hardware_train_total": fpt.hardware_train * tokens,
                  "train_6nd": train_flops_6nd(pc.active_per_token, tokens),
                  "moe_forward_per_token": moe_flops_per_token(m)},
        "memory": {
            "per_device": {"weights": peak.states.weights, "gradients": peak.states.gradients,
                           "optimizer": peak.states.optimizer, "activations": peak.activations,
                           "total": peak.total},
            "capacity": capacity, "fits": peak.total <= capacity,
            "headroom": capacity - peak.total, "peak_stage": peak.stage,
            "activations_per_layer": per_layer, "inflight_microbatches": peak.inflight,
            "per_stage": [{"stage": s.stage, "params": s.params, "weights": s.states.weights,
                           "gradients": s.states.gradients, "optimizer": s.states.optimizer,
                           "activations": s.activations, "inflight": s.inflight,
                           "layers": n, "total": s.total}
                          for s, n in zip(stages, layout_rank_layers(m, lay), strict=True)],
            "by_zero_stage": _states(dense, lay.dtype, groups.dense, experts, groups.experts),
            "zero_shard_group": groups.dense, "zero_replicas": groups.replicas,
        },
        "time": _time(fpt.train * tokens, lay.tokens_per_step, per_step, lay.gpus, acc,
                      lay.dtype, a, fpt.hardware_train / fpt.train,
                      fp8.linear_flop_share(m, lay.seq)),
        "comm": {
            "dp_bytes_per_step": dp_inside + dp_across,
            # HSDP: inside the shard group (reduce-scatter, all-gather) and across replicas
            # (all-reduce of each rank's shard); without HSDP all of it is inside.
            "dp_shard_group_bytes_per_step": dp_inside,
            "dp_replica_bytes_per_step": dp_across,
            "tp_bytes_per_step": max(tp_bytes_per_stage(m, lay)),
            "pp_bytes_per_step": max(pp_bytes_per_rank(m, lay)),
            "ep_bytes_per_step": ep_bytes,
            "cp_bytes_per_step": cp_bytes,
            "embedding_sync_bytes_per_step": embedding_sync_bytes(m, lay),
            "dp_bytes_per_step_by_zero": {
                str(z): sum(layout_dp_bytes(dense, experts, lay, z)) for z in range(4)},
            "dp_link": link_dp.name, "dp_replica_link": link_replica.name,
            "tp_link": link_tp.name, "ep_link": ep_link_name, "cp_link": link_cp.name,
            # One all-reduce of the gradients over all dp x cp replicas (DDP's, ZeRO-0).
            "dp_allreduce_seconds": (
                grad_allreduce(dense, groups.dense * groups.replicas, link_replica)
                + grad_allreduce(experts, groups.experts * groups.expert_replicas,
                                 link_replica)),
            "dp_replica_allreduce_seconds": (
                grad_allreduce(dense / groups.dense, groups.replicas, link_replica)
                + grad_allreduce(experts / groups.experts, groups.expert_replicas,
                                 link_replica)),
            "ep_alltoall_seconds": alltoall_seconds(ep_bytes, lay.ep, acc.intra_link,
                                                    alltoall_calls(m, lay), acc.inter_link,
                                                    ep_node),
            "cp_seconds": cp_seconds(m, lay, link_cp),
        },
        "cp": cp_section(m, lay, link_cp.name),
        "moe": moe_section(m, lay, a.routing_imbalance),
        "inference": {
            "kv_bytes_per_token": kv_bytes_per_token(sm, bp), "bytes_per_value": bp,
            "batch": a.decode_batch, "context": context, "devices": devices,
            "weights_bytes": weights_bytes, "kv_cache_bytes": kv_cache,
            "memory_per_device": infer_mem, "fits": infer_mem <= capacity,
            "max_batch": max_decode_batch(sm, acc, context, devices, bp),
            "prefill": {**_roof(prefill.roofline), "tokens_per_s": prefill.tokens_per_s},
            "decode": {**_roof(decode.roofline), "tokens_per_s": decode.tokens_per_s},
        },
        "operators": {"train": ops(lay.micro_batch, lay.seq // lay.cp, lay.seq),
                      "decode": ops(a.decode_batch, 1, context, sm)},
    }


def _hardware(acc: Accelerator, policy: DtypePolicy, share: float = 1.0) -> dict[str, Any]:
    """The device: its peak in the compute dtype and, with fp8, the linear layers' fp8 peak,
    their share of the FLOPs and the blended peak the MFU applies to."""
    return {"name": acc.name, "source": acc.source, "peak_flops": acc.peak(policy.compute),
            "compute_dtype": policy.compute, "linear_dtype": policy.linear_compute,
            "linear_peak_flops": acc.peak(policy.linear_compute),
            "linear_flop_share": share if policy.is_fp8 else None,
            "effective_peak_flops": effective_peak(acc, policy, share),
            "memory_bytes": acc.memory_bytes,
            "memory_bandwidth": acc.memory_bandwidth, "power_watts": acc.power_watts,
            "gpus_per_node": acc.gpus_per_node,
            "intra_link": asdict(acc.intra_link), "inter_link": asdict(acc.inter_link)}


def params_budget(n_params: float, acc: Accelerator, *, gpus: int, tp: int, pp: int,
                  zero: int, policy: DtypePolicy, a: Assumptions = Assumptions()
                  ) -> dict[str, Any]:
    """What a bare parameter count answers: model states per device, 6ND, time, DP traffic.

    Parameters are taken as split evenly over tp x pp; everything that needs the
    shape (activations, exact FLOPs, inference) is left out.
    """
    dp = gpus // (tp * pp)
    tokens = a.tokens if a.tokens is not None else CHINCHILLA_TOKENS_PER_PARAM * n_params
    per_rank = n_params / (tp * pp)
    states = zero_state_bytes(per_rank, policy, zero, dp)
    flops = train_flops_6nd(n_params, tokens)
    # A bare count: 6ND counts only the weights' matmuls, all linear layers (fp8 with fp8).
    peak = effective_peak(acc, policy, 1.0)
    t = train_time(flops, gpus, peak, a.mfu, a.price_per_gpu_hour, acc.power_watts)
    return {
        "layout": {"dp": dp, "tp": tp, "pp": pp, "zero": zero, "dtype": policy.name,
                   "gpus": gpus},
        "hardware": _hardware(acc, policy),
        "assumptions": {"mfu": a.mfu, "tokens": tokens, "tokens_default": a.tokens is None,
                        "price_per_gpu_hour": a.price_per_gpu_hour},
        "params": {"total": n_params, "per_device": per_rank},
        "flops": {"train_6nd": flops, "train_total": flops},
        "memory": {"per_device": {"weights": states.weights, "gradients": states.gradients,
                                  "optimizer": states.optimizer, "activations": None,
                                  "total": states.total},
                   "capacity": acc.memory_bytes, "fits": states.total <= acc.memory_bytes,
                   "by_zero_stage": _states(per_rank, policy, dp)},
        "time": {"train_seconds": t.seconds, "train_days": t.days, "gpu_hours": t.gpu_hours,
                 "cost": t.cost, "energy_kwh": t.energy_kwh},
        "comm": {"dp_bytes_per_step": dp_bytes_per_step(per_rank, policy, zero, dp),
                 "dp_bytes_per_step_by_zero": {str(z): dp_bytes_per_step(per_rank, policy, z, dp)
                                               for z in range(4)}},
    }
