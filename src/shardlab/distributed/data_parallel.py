"""Data parallelism of shardlab's :class:`~shardlab.nn.model.TransformerLM`: FSDP2 or DDP.

FSDP2 (:func:`apply_fsdp`): ``fully_shard`` on each block, the embedding, the final norm
with the head, then the root, as torchtitan's ``apply_fsdp``, with mixed precision
through ``MixedPrecisionPolicy`` and the force-sum workaround applied only when the
backend's ``ReduceOp.AVG`` is measured summed
(:mod:`shardlab.distributed.avg_probe`). DDP (:func:`apply_ddp`): torch's composable
``replicate``, as torchtitan's ``apply_ddp``. It is the last step of
:func:`shardlab.distributed.parallelize.parallelize`, after tensor parallelism and
activation checkpointing.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate import replicate
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from shardlab.distributed.activation_checkpoint import named_blocks
from shardlab.distributed.avg_probe import needs_force_sum, probe_avg_ratio
from shardlab.distributed.launch import RankContext
from shardlab.errors import SpecError
from shardlab.estimate.comm import experts_cut_on_dim1
from shardlab.nn.moe import GroupedExperts

DpMode = Literal["ddp", "fsdp", "fsdp-zero2"]
DP_MODES: tuple[str, ...] = ("ddp", "fsdp", "fsdp-zero2")

_FORCE_SUM: dict[str, bool] = {}  # per backend: the gloo AVG probe's verdict, once a process


def _force_sum_needed(mesh: Any) -> bool:
    """Whether FSDP2 needs ``set_force_sum_reduction_for_comms(True)`` on this backend.

    Measured once per process and backend by
    :func:`shardlab.distributed.avg_probe.probe_avg_ratio` (a reduce-scatter over the
    default group: every rank must get here), never assumed.
    """
    backend = str(dist.get_backend())
    if backend not in _FORCE_SUM:
        device = "cpu"
        if mesh.device_type == "cuda":
            device = f"cuda:{torch.cuda.current_device()}"
        world = dist.get_world_size()
        ctx = RankContext(rank=dist.get_rank(), world_size=world, local_rank=0,
                          device=device, backend=backend, timeout_s=0.0)
        _FORCE_SUM[backend] = needs_force_sum(probe_avg_ratio(ctx), world)
    return _FORCE_SUM[backend]


def apply_fsdp(model: nn.Module, dp_mesh: Any, reshard_after_forward: bool = True,
               param_dtype: torch.dtype | None = None,
               reduce_dtype: torch.dtype = torch.float32,
               force_sum: bool | None = None) -> nn.Module:
    """FSDP2 (``fully_shard``) on each block, the embedding (with learned positions), the
    final norm with the head, then the root, as torchtitan's ``apply_fsdp``
    (``torchtitan/distributed/fsdp.py`` at b5bcd76c).

    ``reshard_after_forward=False`` keeps the gathered parameters from forward to backward
    (ZeRO-2-like: one all-gather per step instead of two). The final norm and the head
    keep theirs in any case (torchtitan's default policy: "do not reshard_after_forward the
    last layers since FSDP would prefetch them immediately"), so they are gathered once per
    micro-batch; a tied head is one unit with the embedding, kept as well. Stages of a
    pipeline hold one end or none. With ``param_dtype`` (bf16)
    compute runs on ``param_dtype`` copies and gradients are reduced in ``reduce_dtype``
    (``MixedPrecisionPolicy``); without it, FSDP2's default policy (no casts: the
    parameters' own dtype everywhere, so float64 stays float64). ``force_sum``: None
    probes the backend's ``ReduceOp.AVG`` (see :mod:`shardlab.distributed.avg_probe`) and
    sets ``set_force_sum_reduction_for_comms(True)`` only when AVG is found summed. Tensor-
    parallel parameters (DTensors on a sibling ``tp`` mesh) become 2-D (dp, tp) DTensors.
    In place; returns the model.
    """
    policy = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
              if param_dtype is not None else MixedPrecisionPolicy())
    config = {"mesh": dp_mesh, "mp_policy": policy,
              "reshard_after_forward": reshard_after_forward}
    blocks = [block for _, block in named_blocks(model)]
    for block in blocks:
        fully_shard(block, **config, shard_placement_fn=_experts_on_dim1(block, dp_mesh.size()))
    units = [*blocks, *_shard_ends(model, config), model]
    # The root keeps FSDP2's own choice (None: not resharded after forward); it holds no
    # parameter of its own once the blocks and the ends are units.
    fully_shard(model, **{**config, "reshard_after_forward": None})
    if force_sum is None:
        force_sum = _force_sum_needed(dp_mesh)
    if force_sum:
        for module in units:
            module.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    return model


def _experts_on_dim1(block: nn.Module, shards: int) -> Any:
    """A block's ``shard_placement_fn``: its grouped experts (a MoE block without expert
    parallelism) cut on dim 1 when they are fewer than the ``shards``, as
    :func:`~shardlab.distributed.expert_parallel.expert_placement` cuts expert-parallel
    ones (FSDP2 would pad dim 0 to the shards: 8 experts over 64 ranks gathered as 64);
    None (dim 0 for every parameter) otherwise."""
    params = {id(p) for m in block.modules() if isinstance(m, GroupedExperts)
              and experts_cut_on_dim1(m.w_up.shape[0], shards, False)
              for p in m.parameters()}
    if not params:
        return None
    return lambda param: Shard(1) if id(param) in params else None


def _shard_ends(model: nn.Module, config: dict[str, Any]) -> list[nn.Module]:
    """``fully_shard`` on the model's ends (:func:`apply_fsdp`): the embedding and learned
    positions resharded as the blocks are, the final norm and head kept gathered; one kept
    unit when the head is tied to the embedding. Returns a module of each unit."""
    embed = [m for m in (getattr(model, "embed", None), getattr(model, "pos", None))
             if m is not None]
    head = [m for m in (getattr(model, "final_norm", None), getattr(model, "lm_head", None))
            if m is not None]
    tied = (bool(embed) and bool(head)
            and getattr(model.lm_head, "weight", None) is getattr(model.embed, "weight", None))
    kept = {**config, "reshard_after_forward": False}
    if tied:
        fully_shard(embed + head, **kept)
        return [embed[0]]
    if embed:
        fully_shard(embed, **config)
    if head:
        fully_shard(head, **kept)
    return [group[0] for group in (embed, head) if group]


def _has_dtensor_params(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def apply_ddp(model: nn.Module, dp_mesh: Any) -> nn.Module:
    """DDP through torch's composable ``replicate`` (torchtitan's ``apply_ddp``), in place.

    Gradients are all-reduced and averaged over ``dp_mesh`` in backward (bucketed).
    Refuses a model whose parameters are DTensors (tensor-parallel shards): DDP
    replicates whole plain tensors; use FSDP for dp x tp.
    """
    if _has_dtensor_params(model):
        raise SpecError("dp_mode", "ddp", "cannot hold tensor-parallel (DTensor) parameters: "
                        "use dp_mode='fsdp' (or 'fsdp-zero2') with tp > 1")
    replicate(model, device_mesh=dp_mesh)
    return model
