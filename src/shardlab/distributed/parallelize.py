"""Parallelism applied to shardlab's :class:`~shardlab.nn.model.TransformerLM` from outside.

Nothing in the model changes: every transformation here is torch's own (DTensor parallel
styles, forward hooks, wrappers), addressed by the model's module names. The order is
torchtitan's (``parallelize_llama`` in ``torchtitan/models/llama3/infra/parallelize.py``):

1. **Tensor parallelism** (:func:`apply_tp`), Megatron-LM's column/row split (Shoeybi et
   al. 2019) with its sequence-parallel variant (Korthikanti et al. 2022), written as a
   declarative plan of ``torch.distributed.tensor.parallel`` styles (:func:`tp_plan`);
2. **activation checkpointing** (:func:`apply_ac`): every block recomputed in backward
   (``full``), or only the attention core (``selective``, the model's own flag);
3. **data parallelism**: FSDP2 (:func:`apply_fsdp`, ``fully_shard`` per block then the
   root, as torchtitan's ``apply_fsdp``) or DDP (:func:`apply_ddp`, composable
   ``replicate`` as torchtitan's ``apply_ddp``).

:func:`parallelize` applies them in that order on a mesh with named dims ``("dp", "tp")``
(a ``"pp"`` dim may be present; pipeline stages are cut elsewhere).

Decisions the model's layout forces (each checked against an unsharded model in float64
by ``tests/distributed/test_parallelize.py``):

* **Attention on local heads.** q/k/v are ``ColwiseParallel`` and o ``RowwiseParallel``
  with ``use_local_output=True``, so :func:`~shardlab.nn.model.attend` sees plain
  per-rank tensors of ``heads / tp`` query and ``kv_heads / tp`` key/value heads (it views
  by ``head_dim``). The mask and rotary tables the model builds in ``forward`` are full
  length and plain: without sequence parallelism the activations are full length; with it,
  ``PrepareModuleInput`` all-gathers the sequence before q/k/v (Shard(1) -> Replicate),
  so attention still runs on the whole sequence. Hence ``heads``, ``kv_heads`` and
  ``d_ff`` must divide by ``tp`` and, with sequence parallelism, so must the sequence
  length (checked by a forward pre-hook, as torchtitan asserts ``seq_len % tp == 0``).
* **Tied head (gpt style: ``lm_head.weight is embed.weight``).** Sharding the embedding
  row-wise (vocab dim 0 of ``[V, d]``) and the head column-wise (``[V, d]`` dim 0 too)
  would give one tensor two parallel styles, and ``parallelize_module`` would replace
  each module's parameter with its own DTensor: the tie would silently break. For tied
  models ``embed``, ``pos`` and ``lm_head`` therefore stay **replicated** (plain tensors,
  the same computation on every tensor-parallel rank, so their gradients agree without
  communication); only the blocks are split. ``loss_parallel`` needs a vocab-sharded
  head, so it is refused for tied models (:class:`~shardlab.errors.SpecError` naming
  ``loss_parallel``).
* **Learned positions with sequence parallelism (gpt style).** The model adds ``pos``
  inside ``embed_tokens``, after the embedding, to full-length ``[s, d]`` positions; an
  embedding that emitted its Shard(1) sequence chunk would not match them. So whenever
  the embedding cannot emit the sequence shard itself (learned positions, or a tied,
  replicated embedding) it emits a replicated ``[b, s, d]`` and the sequence is scattered
  at the input of ``blocks.0`` (``PrepareModuleInput`` Replicate -> Shard(1), a local
  slice whose backward all-gathers the gradient, so ``pos`` and ``embed`` get the full,
  identical gradient on every rank). For a replicated head the sequence is gathered
  again at the input of ``final_norm`` (Shard(1) -> Replicate). Untied llama style
  follows torchtitan exactly: the embedding reduce-scatters into Shard(1), ``final_norm``
  is ``SequenceParallel``, and the head all-gathers its input.
* **Vocabulary.** A sharded embedding/head needs ``vocab % tp == 0`` (Megatron-LM pads
  the vocabulary to a multiple of ``make-vocab-size-divisible-by * tp`` for the same
  reason); tied models keep the full vocabulary on every rank and need nothing.

With ``loss_parallel`` the logits are a DTensor sharded on the vocabulary (``Shard(-1)``)
and the caller computes the loss inside
``torch.distributed.tensor.parallel.loss_parallel()``; :func:`lm_loss_sum_any` is
:func:`shardlab.nn.loss.lm_loss_sum` written so it also works there (a masked product of
a DTensor with a plain mask would mix tensor kinds).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from shardlab.config.model import ModelShape
from shardlab.errors import SpecError, require_positive_int

AcMode = Literal["none", "selective", "full"]
DpMode = Literal["ddp", "fsdp", "fsdp-zero2"]
AC_MODES: tuple[str, ...] = ("none", "selective", "full")
DP_MODES: tuple[str, ...] = ("ddp", "fsdp", "fsdp-zero2")
IGNORE_INDEX = -100  # cross_entropy's default ignore_index


# --- tensor parallelism -----------------------------------------------------------------

def _scatters_at_blocks(shape: ModelShape) -> bool:
    """Whether, under sequence parallelism, the sequence is scattered at ``blocks.0``
    (the embedding output is replicated: learned positions are added after it, or a tied
    embedding is not split at all) rather than by the embedding's reduce-scatter."""
    return shape.tied or shape.style == "gpt"


def block_plan(shape: ModelShape, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """One block's plan, keyed by the block's sub-module names (torchtitan's layer plan).

    Megatron-LM's split: q/k/v and gate/up column-parallel (each rank its heads, its
    ``d_ff / tp`` columns), o and down row-parallel (partial sums reduced). With
    ``sequence_parallel`` the norms run on Shard(1) sequence chunks (``SequenceParallel``),
    the attention and MLP inputs are all-gathered (``PrepareModuleInput`` Shard(1) ->
    Replicate) and the row-parallel outputs reduce-scattered back to Shard(1).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    local = {"use_local_output": True}
    row_out = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {
        "attn.q_proj": ColwiseParallel(**local),
        "attn.k_proj": ColwiseParallel(**local),
        "attn.v_proj": ColwiseParallel(**local),
        "attn.o_proj": RowwiseParallel(output_layouts=row_out, **local),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=row_out),
    }
    if shape.style == "llama":
        plan["mlp.gate_proj"] = ColwiseParallel()
    if sequence_parallel:
        plan |= {
            "attn_norm": SequenceParallel(),
            # Attention.forward(x, mask, rope): only x is sharded; mask and rope are plain
            # full-length tensors (or None) and pass through untouched.
            "attn": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                       desired_input_layouts=(Replicate(), None, None)),
            "mlp_norm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),),
                                      desired_input_layouts=(Replicate(),)),
        }
    return plan


def root_plan(shape: ModelShape, sequence_parallel: bool,
              loss_parallel: bool) -> dict[str, ParallelStyle]:
    """The model-level plan: ``embed``, ``final_norm``, ``lm_head`` (and the sequence
    scatter at ``blocks.0`` when the embedding cannot do it; see the module docstring).

    Untied: the embedding row-parallel (vocab-sharded, output reduce-scattered to Shard(1)
    under sequence parallelism, else all-reduced), the head column-parallel (vocab-sharded
    output: gathered to Replicate, or left Shard(-1) as a DTensor for ``loss_parallel``).
    Tied: embedding and head replicated (untouched). Raises SpecError for
    ``loss_parallel`` with a tied head.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if loss_parallel and shape.tied:
        raise SpecError("loss_parallel", True, "needs an untied head (the model's shape is "
                        "tied: the shared embedding/head weight stays replicated under "
                        "tensor parallelism, so its logits are never vocab-sharded)")
    plan: dict[str, ParallelStyle] = {}
    scatter_late = sequence_parallel and _scatters_at_blocks(shape)
    if not shape.tied:
        emb_out = Shard(1) if sequence_parallel and not scatter_late else Replicate()
        plan["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=emb_out)
    if scatter_late:
        # Block.forward(x, mask, rope): scatter x's sequence; a local slice forward, an
        # all-gather of the gradient backward.
        plan["blocks.0"] = PrepareModuleInput(input_layouts=(Replicate(), None, None),
                                              desired_input_layouts=(Shard(1), None, None),
                                              use_local_output=True)
    if shape.tied:
        if sequence_parallel:  # gather the sequence for the replicated norm and head
            plan["final_norm"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                    desired_input_layouts=(Replicate(),),
                                                    use_local_output=True)
        return plan
    if sequence_parallel:
        plan["final_norm"] = SequenceParallel()
    plan["lm_head"] = ColwiseParallel(
        input_layouts=Shard(1) if sequence_parallel else Replicate(),
        output_layouts=Shard(-1) if loss_parallel else Replicate(),
        use_local_output=not loss_parallel)
    return plan


def tp_plan(shape: ModelShape, sequence_parallel: bool = False,
            loss_parallel: bool = False) -> dict[str, ParallelStyle]:
    """The whole declarative plan for ``parallelize_module(model, tp_mesh, plan)``.

    :func:`root_plan` plus :func:`block_plan` with every key prefixed ``blocks.*.``
    (``parallelize_module`` matches ``*`` against child names with ``fnmatch``), so the
    values are ``ParallelStyle`` objects keyed by module path. As torchtitan's
    ``apply_tp``, with shardlab's module names.
    """
    plan = root_plan(shape, sequence_parallel, loss_parallel)
    plan |= {f"blocks.*.{k}": v for k, v in block_plan(shape, sequence_parallel).items()}
    return plan


def check_tp(shape: ModelShape, tp: int) -> None:
    """Raise SpecError unless ``tp`` splits the heads, kv heads, d_ff (and vocab, untied)."""
    require_positive_int("tp", tp)
    if shape.moe is not None:
        raise SpecError("tp", tp, "mixture-of-experts models are not built in torch")
    for field in ("heads", "kv_heads", "d_ff"):
        n = getattr(shape, field)
        if n % tp:
            raise SpecError("tp", tp, f"must divide {field} ({n}): each rank owns whole "
                            "heads / an equal share of the MLP columns")
    if not shape.tied and shape.vocab % tp:
        raise SpecError("tp", tp, f"must divide vocab ({shape.vocab}) for the vocab-sharded "
                        "embedding and head (pad the vocabulary, as Megatron-LM does)")


def _seq_divisible_hook(tp: int) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = args[0] if args else kwargs.get("ids")
        if ids is not None and ids.shape[1] % tp:
            raise SpecError("seq", int(ids.shape[1]),
                            f"must be a multiple of tp ({tp}) under sequence parallelism")
    return hook


def _match_grad_placements(param: torch.Tensor) -> None:
    """Post-accumulate-grad hook: bring a DTensor gradient to its parameter's placements."""
    grad = param.grad
    placements = getattr(param, "placements", None)
    if grad is not None and placements is not None and \
            getattr(grad, "placements", placements) != placements:
        param.grad = grad.redistribute(grad.device_mesh, placements)  # type: ignore[attr-defined]


def apply_tp(model: nn.Module, tp_mesh: Any, sequence_parallel: bool = False,
             loss_parallel: bool = False) -> nn.Module:
    """Shard ``model`` (a TransformerLM) over the 1-D ``tp_mesh`` with :func:`tp_plan`.

    In place; returns the model. ``loss_parallel``: the logits come back as a DTensor
    sharded on the vocabulary and the caller computes the loss inside
    ``torch.distributed.tensor.parallel.loss_parallel()`` (see :func:`lm_loss_sum_any`).
    With ``sequence_parallel`` a forward pre-hook refuses sequence lengths ``tp`` does not
    divide.

    Every gradient is brought to its parameter's placements as it is accumulated (a
    post-accumulate-grad hook). DTensor's backward otherwise leaves the sequence-parallel
    norm weights' gradients ``Partial`` (reduced lazily wherever they are used, e.g. in
    the optimizer; Megatron-LM all-reduces these layernorm gradients over the tensor-parallel
    group once) and the vocab-sharded embedding's gradient ``Replicate`` (the full
    ``[V, d]`` on every rank; measured in torch 2.13). Under FSDP2 the hooks stay on the
    original parameters and FSDP's own reduce-scatter places the gradients.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    shape: ModelShape = model.shape  # type: ignore[assignment]
    tp = tp_mesh.size()
    check_tp(shape, tp)
    if tp == 1:
        if sequence_parallel or loss_parallel:
            raise SpecError("tp", 1, "sequence/loss parallelism need tp > 1")
        return model
    parallelize_module(model, tp_mesh, tp_plan(shape, sequence_parallel, loss_parallel))
    for param in model.parameters():
        if hasattr(param, "placements"):  # a DTensor
            param.register_post_accumulate_grad_hook(_match_grad_placements)
    if sequence_parallel:
        model.register_forward_pre_hook(_seq_divisible_hook(tp), with_kwargs=True)
    return model


def lm_loss_sum_any(logits: torch.Tensor, targets: torch.Tensor,
                    loss_mask: torch.Tensor) -> torch.Tensor:
    """:func:`shardlab.nn.loss.lm_loss_sum` that also takes vocab-sharded DTensor logits.

    Plain logits: exactly ``lm_loss_sum``. DTensor logits (``loss_parallel``; call inside
    ``loss_parallel()``): masked targets become ``ignore_index`` and cross entropy sums
    them, so no plain mask multiplies a DTensor. Returns a scalar (a DTensor for DTensor
    logits, whose backward runs the vocab-parallel cross entropy).
    """
    from torch.distributed.tensor import DTensor

    from shardlab.nn.loss import lm_loss_sum

    if not isinstance(logits, DTensor):
        return lm_loss_sum(logits, targets, loss_mask)
    masked = torch.where(loss_mask.bool(), targets, torch.full_like(targets, IGNORE_INDEX))
    return nn.functional.cross_entropy(logits.flatten(0, 1), masked.flatten(),
                                       reduction="sum", ignore_index=IGNORE_INDEX)


# --- activation checkpointing -------------------------------------------------------------

def _inner(block: nn.Module) -> nn.Module:
    """The block under a checkpoint wrapper (or the block itself)."""
    return getattr(block, "_checkpoint_wrapped_module", block)


def apply_ac(model: nn.Module, mode: AcMode) -> nn.Module:
    """Activation checkpointing of every block (torchtitan's ``apply_ac``), in place.

    ``full``: each ``model.blocks[i]`` replaced by ``checkpoint_wrapper(block)``
    (non-reentrant): only the block's input is kept, its forward re-run in backward.
    ``selective``: ``block.attn.recompute_core = True`` (Korthikanti et al. 2022's
    selective recomputation of the attention core's ``s x s`` intermediates; the model
    implements it). ``none``: nothing. Parameter names under ``full`` gain the wrapper's
    ``_checkpoint_wrapped_module.`` segment (its state-dict hook strips it again).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        CheckpointWrapper,
        checkpoint_wrapper,
    )

    if mode not in AC_MODES:
        raise SpecError("ac", mode, f"must be one of {', '.join(AC_MODES)}")
    blocks = model.blocks
    for key, block in _named_blocks(model):
        if mode == "full" and not isinstance(block, CheckpointWrapper):
            blocks[key] = checkpoint_wrapper(  # type: ignore[index]
                block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        elif mode == "selective":
            _inner(block).attn.recompute_core = True
    return model


def _named_blocks(model: nn.Module) -> list[tuple[Any, nn.Module]]:
    """(key, block) of ``model.blocks``: a ModuleList (the whole model) or a ModuleDict keyed
    by the original layer index (a pipeline stage, :mod:`shardlab.distributed.pipeline`)."""
    blocks = model.blocks
    if isinstance(blocks, nn.ModuleDict):
        return list(blocks.items())
    return list(enumerate(blocks))  # type: ignore[arg-type]


# --- data parallelism --------------------------------------------------------------------

_FORCE_SUM: dict[str, bool] = {}  # per backend: the gloo AVG probe's verdict, once a process


def _force_sum_needed(mesh: Any) -> bool:
    """Whether FSDP2 needs ``set_force_sum_reduction_for_comms(True)`` on this backend.

    Measured once per process and backend by :func:`shardlab.verify.gloo_avg.probe_avg_ratio`
    (a reduce-scatter over the default group: every rank must get here), never assumed.
    """
    from shardlab.distributed.launch import RankContext
    from shardlab.verify.gloo_avg import needs_force_sum, probe_avg_ratio

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
    """FSDP2 (``fully_shard``) on each block, then the root (torchtitan's ``apply_fsdp``).

    ``reshard_after_forward=False`` keeps the gathered parameters from forward to backward
    (ZeRO-2-like: one all-gather per step instead of two). With ``param_dtype`` (bf16)
    compute runs on ``param_dtype`` copies and gradients are reduced in ``reduce_dtype``
    (``MixedPrecisionPolicy``); without it, FSDP2's default policy (no casts: the
    parameters' own dtype everywhere, so float64 stays float64). ``force_sum``: None
    probes the backend's ``ReduceOp.AVG`` (see :mod:`shardlab.verify.gloo_avg`) and sets
    ``set_force_sum_reduction_for_comms(True)`` only when AVG is found summed. Tensor-
    parallel parameters (DTensors on a sibling ``tp`` mesh) become 2-D (dp, tp) DTensors.
    In place; returns the model.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
              if param_dtype is not None else MixedPrecisionPolicy())
    config = {"mesh": dp_mesh, "mp_policy": policy,
              "reshard_after_forward": reshard_after_forward}
    blocks = [block for _, block in _named_blocks(model)]
    for block in blocks:
        fully_shard(block, **config)
    fully_shard(model, **config)
    if force_sum is None:
        force_sum = _force_sum_needed(dp_mesh)
    if force_sum:
        for module in [*blocks, model]:
            module.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    return model


def _has_dtensor_params(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def apply_ddp(model: nn.Module, dp_mesh: Any) -> nn.Module:
    """DDP through torch's composable ``replicate`` (torchtitan's ``apply_ddp``), in place.

    Gradients are all-reduced and averaged over ``dp_mesh`` in backward (bucketed).
    Refuses a model whose parameters are DTensors (tensor-parallel shards): DDP
    replicates whole plain tensors; use FSDP for dp x tp.
    """
    from torch.distributed._composable.replicate import replicate

    if _has_dtensor_params(model):
        raise SpecError("dp_mode", "ddp", "cannot hold tensor-parallel (DTensor) parameters: "
                        "use dp_mode='fsdp' (or 'fsdp-zero2') with tp > 1")
    replicate(model, device_mesh=dp_mesh)
    return model


# --- everything, in order ----------------------------------------------------------------

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
                ac: AcMode = "none", param_dtype: torch.dtype | None = None) -> nn.Module:
    """TP -> activation checkpointing -> FSDP or DDP on ``model`` (torchtitan's order).

    ``mesh`` has named dims; ``mesh["tp"]`` is used when ``tp > 1`` and ``mesh["dp"]``
    when ``dp > 1`` (their sizes must match; other dims such as ``"pp"`` are ignored).
    ``dp_mode``: ``ddp``, ``fsdp`` or ``fsdp-zero2`` (``reshard_after_forward=False``).
    ``param_dtype`` (FSDP only): bf16 compute with fp32 gradient reduction. In place;
    returns the model. Validates everything before touching the model.
    """
    require_positive_int("tp", tp)
    require_positive_int("dp", dp)
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
    dp_mesh = _sub_mesh(mesh, "dp", dp) if dp > 1 else None
    if tp_mesh is not None:  # validates (check_tp, the plan) before it changes anything
        apply_tp(model, tp_mesh, sequence_parallel=sp, loss_parallel=loss_parallel)
    apply_ac(model, ac)
    if dp_mesh is not None:
        if dp_mode == "ddp":
            apply_ddp(model, dp_mesh)
        else:
            apply_fsdp(model, dp_mesh, reshard_after_forward=dp_mode == "fsdp",
                       param_dtype=param_dtype)
    elif param_dtype is not None:
        raise SpecError("param_dtype", str(param_dtype), "needs FSDP (dp > 1)")
    return model


# --- memory ---------------------------------------------------------------------------

def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _bytes(tensors: list[torch.Tensor], seen: set[tuple[int, int, int, str]]) -> int:
    total = 0
    for t in tensors:
        loc = _local(t)
        key = (loc.untyped_storage().data_ptr(), loc.storage_offset(), loc.numel(),
               str(loc.dtype))
        if loc.numel() == 0 or key in seen:
            continue
        seen.add(key)
        total += loc.numel() * loc.element_size()
    return total


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None
                ) -> dict[str, int]:
    """Bytes this rank holds: parameters, gradients, optimizer state, and their total.

    DTensors count their local shard (``to_local()``: elements held, so FSDP2's padding
    of an uneven last shard is not counted); a tensor reached twice (a tied weight, a
    shared storage) counts once. ``optimizer`` counts every non-scalar state
    tensor (AdamW's ``exp_avg`` and ``exp_avg_sq``); the 0-dim ``step`` counters are left
    out so the figure compares with the estimator's ``2 x params`` of Adam moments.
    """
    seen: set[tuple[int, int, int, str]] = set()
    params = list(model.parameters())
    out = {"params": _bytes(params, seen)}
    out["grads"] = _bytes([p.grad for p in params if p.grad is not None], seen)
    states: list[torch.Tensor] = []
    if optimizer is not None:
        for state in optimizer.state.values():
            states += [v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    out["optimizer"] = _bytes(states, seen)
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out
