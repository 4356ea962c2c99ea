"""Parallelism applied to shardlab's :class:`~shardlab.nn.model.TransformerLM` from outside.

Nothing in the model changes: every transformation is torch's own (DTensor parallel
styles, forward hooks, wrappers), addressed by the model's module names. The order is
torchtitan's (``parallelize_llama`` in ``torchtitan/models/llama3/infra/parallelize.py``):

1. **Tensor parallelism** (:mod:`shardlab.distributed.tensor_parallel`), Megatron-LM's
   column/row split (Shoeybi et al. 2019) with its sequence-parallel variant (Korthikanti
   et al. 2022), written as a declarative plan of ``torch.distributed.tensor.parallel``
   styles (:func:`~shardlab.distributed.tensor_parallel.tp_plan`);
2. **activation checkpointing** (:mod:`shardlab.distributed.activation_checkpoint`):
   every block recomputed in backward (``full``), or only the attention core
   (``selective``, the model's own flag);
3. **data parallelism** (:mod:`shardlab.distributed.data_parallel`): FSDP2
   (``fully_shard`` per block then the root, as torchtitan's ``apply_fsdp``) or DDP
   (composable ``replicate`` as torchtitan's ``apply_ddp``).

With ``ep > 1`` or ``etp = tp > 1`` (a mixture-of-experts model) the routed experts are
split over the mesh's ``ep`` dim (and their width over ``tp``) right after tensor
parallelism (:mod:`shardlab.distributed.expert_parallel`, torchtitan's ``apply_moe_ep_tp``
at the same place), and FSDP shards them over ``edp`` (dp / ep) before the blocks over
``dp``. Beside context parallelism or HSDP the ep ranks are still consecutive dp
ranks, and the experts are sharded over the (dp_shard/ep)·cp ranks that hold the same
ones, hybrid across the replicas (:func:`shardlab.distributed.mesh.make_mesh`).

Context parallelism (``cp > 1``, :mod:`shardlab.distributed.context_parallel`) changes no
parameter: every attention layer gets the all-gather of K and V over the mesh's ``cp``
dim, and data parallelism runs over dp x cp (the mesh's ``fsdp`` dim: FSDP shards over
``dp_shard_cp``, or with ``dp_replicate > 1`` over the 2-D ``(dp_replicate,
dp_shard_cp)`` mesh that makes ``fully_shard`` hybrid, HSDP; DDP replicates over it).

:func:`parallelize` applies them in that order on a mesh with named dims ``("dp", "tp")``
(and ``"edp"``, ``"ep"`` with dp = edp x ep flattened, when ep > 1; a ``"pp"`` dim may be
present; pipeline stages are cut elsewhere), after validating every option. Each step
is checked against an unsharded model in float64 by ``tests/distributed/test_parallelize.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardlab.distributed.activation_checkpoint import AC_MODES, AcMode, apply_ac
from shardlab.distributed.context_parallel import apply_cp
from shardlab.distributed.data_parallel import DP_MODES, DpMode, apply_ddp, apply_fsdp
from shardlab.distributed.expert_parallel import apply_ep, shard_experts
from shardlab.distributed.tensor_parallel import apply_tp
from shardlab.errors import SpecError, require_positive_int


def _sub_mesh(mesh: Any, name: str, size: int) -> Any:
    names = tuple(mesh.mesh_dim_names or ())
    if name not in names:
        raise SpecError(name, size, f"needs a mesh dim named {name!r} (mesh dims: {names})")
    sub = mesh[name]
    if sub.size() != size:
        raise SpecError(name, size, f"the mesh's {name!r} dim has size {sub.size()}")
    return sub


def parallelize(model: nn.Module, mesh: Any, *, tp: int = 1, dp: int = 1,
                dp_mode: DpMode = "fsdp", sp: bool = False, loss_parallel: bool = False,
                ac: AcMode = "none", param_dtype: torch.dtype | None = None,
                force_sum: bool | None = None, ep: int = 1, etp: int = 1, cp: int = 1,
                dp_replicate: int = 1) -> nn.Module:
    """TP -> activation checkpointing -> FSDP or DDP on ``model`` (torchtitan's order).

    ``mesh`` has named dims; ``mesh["tp"]`` is used when ``tp > 1`` and ``mesh["dp"]``
    when ``dp > 1`` (their sizes must match; other dims such as ``"pp"`` are ignored).
    ``dp_mode``: ``ddp``, ``fsdp`` or ``fsdp-zero2`` (``reshard_after_forward=False``).
    ``param_dtype`` (FSDP only): bf16 compute with fp32 gradient reduction. ``force_sum``:
    FSDP2's AVG-as-sum workaround (None: probe the backend, see ``apply_fsdp``). ``ep``:
    expert-parallel ranks (dividing dp, or dp/dp_replicate; the mesh's ``ep`` and ``edp``
    dims); ``etp``: 1
    (experts whole on every tensor-parallel rank) or tp (each expert's width split over
    the ``tp`` dim as the dense MLP's). ``cp``: context-parallel ranks (the mesh's ``cp``
    dim; data parallelism then runs over its ``fsdp`` dim, dp x cp ranks); ``dp_replicate``:
    HSDP's replicas (dividing dp; FSDP only). In place; returns the model. Validates
    everything before touching the model.
    """
    require_positive_int("tp", tp)
    require_positive_int("dp", dp)
    require_positive_int("ep", ep)
    require_positive_int("cp", cp)
    require_positive_int("dp_replicate", dp_replicate)
    if dp % dp_replicate or (dp_replicate > 1 and dp_mode == "ddp"):
        raise SpecError("dp_replicate", dp_replicate, f"needs FSDP over a dp ({dp}) it "
                        "divides")
    if ep > 1 and ((dp // dp_replicate) % ep or dp_mode == "ddp"):
        within = f"dp/dp_replicate ({dp // dp_replicate})" if dp_replicate > 1 else f"dp ({dp})"
        raise SpecError("ep", ep, f"needs FSDP over a {within} it divides")
    if etp not in (1, tp):
        raise SpecError("etp", etp, f"must be 1 or tp ({tp})")
    if dp_mode not in DP_MODES:
        raise SpecError("dp_mode", dp_mode, f"must be one of {', '.join(DP_MODES)}")
    if ac not in AC_MODES:
        raise SpecError("ac", ac, f"must be one of {', '.join(AC_MODES)}")
    if tp == 1 and (sp or loss_parallel):
        raise SpecError("sp" if sp else "loss_parallel", True, "needs tp > 1")
    if dp_mode == "ddp" and param_dtype is not None:
        raise SpecError("param_dtype", str(param_dtype), "mixed precision is wired for FSDP "
                        "only (dp_mode='fsdp' or 'fsdp-zero2')")
    if dp_mode == "ddp" and dp > 1 and tp > 1:
        raise SpecError("dp_mode", "ddp", "cannot hold tensor-parallel (DTensor) parameters: "
                        "use dp_mode='fsdp' (or 'fsdp-zero2') with tp > 1")
    tp_mesh = _sub_mesh(mesh, "tp", tp) if tp > 1 else None
    folded = cp > 1 or dp_replicate > 1  # gradients over the mesh's fsdp dim
    if folded:
        dp_mesh = _sub_mesh(mesh, "fsdp", dp * cp) if dp * cp > 1 else None
    else:
        dp_mesh = _sub_mesh(mesh, "dp", dp) if dp > 1 else None
    cp_mesh = _sub_mesh(mesh, "cp", cp) if cp > 1 else None
    experts = ep > 1 or etp > 1  # the experts laid out apart from the dense parameters
    # The experts' shard group: dp/ep ranks, or (dp_shard/ep)·cp beside cp or HSDP, whose
    # FSDP mesh adds the replicas as a second dim (mesh.py's _expert_views).
    edp = dp // dp_replicate // ep * cp
    edp_mesh = _sub_mesh(mesh, "edp", edp) if experts else None
    if experts and folded:
        edp_mesh = mesh["experts_fsdp"]
    if experts:
        _sub_mesh(mesh, "ep", ep)  # checks the dim's size, as the others
    if tp_mesh is not None:  # validates (check_tp, the plan) before it changes anything
        apply_tp(model, tp_mesh, sequence_parallel=sp, loss_parallel=loss_parallel)
    if experts:
        ep_tp = mesh["ep_tp"] if folded else mesh["ep", "tp"]
        apply_ep(model, ep_tp if etp > 1 else mesh["ep"])
    if cp_mesh is not None:
        apply_cp(model, cp_mesh, getattr(mesh, "cp_group", None))
    apply_ac(model, ac)
    if dp_mesh is not None:
        if dp_mode == "ddp":
            apply_ddp(model, dp_mesh)
        else:
            if edp_mesh is not None:  # before the blocks' own fully_shard
                shard_experts(model, edp_mesh, dp * cp, shards=edp,
                              reshard_after_forward=dp_mode == "fsdp",
                              param_dtype=param_dtype)
            apply_fsdp(model, dp_mesh, reshard_after_forward=dp_mode == "fsdp",
                       param_dtype=param_dtype, force_sum=force_sum)
    elif param_dtype is not None:
        raise SpecError("param_dtype", str(param_dtype), "needs FSDP (dp > 1)")
    return model
