"""Tensor parallelism of shardlab's :class:`~shardlab.nn.model.TransformerLM`, from outside.

Megatron-LM's column/row split (Shoeybi et al. 2019) with its sequence-parallel variant
(Korthikanti et al. 2022), written as a declarative plan of
``torch.distributed.tensor.parallel`` styles (:func:`tp_plan`, as torchtitan's
``apply_tp``) keyed by the model's module names, and applied by :func:`apply_tp`. It is
the first step of :func:`shardlab.distributed.parallelize.parallelize`.

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
* **fp8.** A block linear that ``train --dtype fp8`` made a torchao ``Float8Linear``
  takes torchao's float8 style in its place (``Float8ColwiseParallel``,
  ``Float8RowwiseParallel``, ``PrepareFloat8ModuleInput``: :func:`block_plan`), as
  torchtitan's ``enable_float8_tensorwise_tp`` does; :func:`apply_tp` finds them in the
  model it is given.
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

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from shardlab.config.model import ModelShape
from shardlab.distributed.activation_checkpoint import named_blocks
from shardlab.errors import SpecError, require_positive_int
from shardlab.estimate.comm_dtensor import scatters_at_blocks
from shardlab.nn.loss import lm_loss_sum, loss_logits

IGNORE_INDEX = -100  # cross_entropy's default ignore_index


def block_plan(shape: ModelShape, sequence_parallel: bool, moe: bool = False,
               fp8: frozenset[str] = frozenset()) -> dict[str, ParallelStyle]:
    """One block's plan, keyed by the block's sub-module names (torchtitan's layer plan).

    Megatron-LM's split: q/k/v and gate/up column-parallel (each rank its heads, its
    ``d_ff / tp`` columns), o and down row-parallel (partial sums reduced). With
    ``sequence_parallel`` the norms run on Shard(1) sequence chunks (``SequenceParallel``),
    the attention and MLP inputs are all-gathered (``PrepareModuleInput`` Shard(1) ->
    Replicate) and the row-parallel outputs reduce-scattered back to Shard(1); without it
    the inputs enter replicated, once per module (``PrepareModuleInput`` Replicate ->
    Replicate), so backward all-reduces one gradient per module input, not one per
    column-parallel linear (since 2026-12-07).

    Query/key norms (Qwen3, ``shape.qk_norm``) run on the rank's own heads
    (``SequenceParallel(sequence_dim=2)``, as torchtitan's qwen3 plan): their gradients are
    all-reduced over tp, with or without sequence parallelism.

    ``moe``: the block's MLP is a mixture of experts. Its shared experts (``mlp.shared``, a
    dense MLP) split as the dense MLP does, their input entering once (``PrepareModuleInput``
    on ``mlp.shared``, since 2026-12-07: each of their column-parallel linears took its
    own, one backward all-reduce each); the router and the routed experts stay whole
    on every tensor-parallel rank (etp = 1: each rank routes the same tokens and runs the
    same experts, so their gradients agree without communication; torchtitan's MoE
    plan without expert tensor parallelism).

    ``fp8``: the block's sub-modules (``attn.q_proj``, ...) that are torchao
    ``Float8Linear`` (``train --dtype fp8``). They take torchao's float8 styles
    (:func:`float8_styles`), as torchtitan's ``enable_float8_tensorwise_tp``: each casts
    its input to fp8 before the input is redistributed and its output gradient to fp8
    before the backward's redistribution, so under sequence parallelism the forward
    all-gathers and the backward's all-gathers at the row-parallel outputs move 1-byte
    elements. Where every linear that reads the attention's (or the dense MLP's) input is
    fp8, that input is cast once, before its sequence all-gather
    (``PrepareFloat8ModuleInput``); a MoE block's MLP input stays bf16 (its router reads
    it), and its shared experts cast their copy once, at ``mlp.shared``.
    """
    local = {"use_local_output": True}
    row_out = Shard(1) if sequence_parallel else Replicate()
    styles = float8_styles() if fp8 else None

    def colwise(name: str, **kw: Any) -> ParallelStyle:
        return (styles[0] if styles and name in fp8 else ColwiseParallel)(**kw)

    def rowwise(name: str, **kw: Any) -> ParallelStyle:
        return (styles[1] if styles and name in fp8 else RowwiseParallel)(**kw)

    plan: dict[str, ParallelStyle] = {
        "attn.q_proj": colwise("attn.q_proj", **local),
        "attn.k_proj": colwise("attn.k_proj", **local),
        "attn.v_proj": colwise("attn.v_proj", **local),
        "attn.o_proj": rowwise("attn.o_proj", output_layouts=row_out, **local),
    }
    mlp = "mlp.shared." if moe else "mlp."
    mlp_inputs = [mlp + "up_proj"] + ([mlp + "gate_proj"] if shape.style == "llama" else [])
    if not moe or (shape.moe is not None and shape.moe.shared_experts):
        for name in mlp_inputs:
            plan[name] = colwise(name)
        plan[mlp + "down_proj"] = rowwise(mlp + "down_proj", output_layouts=row_out)
    # Each module input enters once, a replicated DTensor (all-gathered from Shard(1) with
    # sequence parallelism), so backward sums the column-parallel linears' partial input
    # gradients first and reduces once per input, as Megatron-LM's f operator does (each
    # linear taking its own Replicate input would all-reduce its own: q, k and v three,
    # gate and up two). Where every reader is fp8 the input is cast there once, before the
    # gather (each linear would cast, and keep for backward, its own fp8 copy).
    source = Shard(1) if sequence_parallel else Replicate()

    def module_input(module: str, reads: list[str], args: int) -> ParallelStyle:
        # Module.forward(x, ...): only x is laid out; Attention's mask and rope are plain
        # full-length tensors (or None) and pass through untouched.
        layouts = {"input_layouts": (source,) + (None,) * (args - 1),
                   "desired_input_layouts": (Replicate(),) + (None,) * (args - 1)}
        if styles and all(r in fp8 for r in reads):
            # torchao reads the cast's config from one reader, named from ``module``.
            return styles[2](fwd_config_submodule_fqn=reads[0][len(module) + 1:], **layouts)
        return PrepareModuleInput(**layouts)

    plan["attn"] = module_input("attn", ["attn.q_proj", "attn.k_proj", "attn.v_proj"], 3)
    if shape.qk_norm:
        # Qwen3's per-head norms see the rank's own heads, [b, s, heads/t, hd] split on dim
        # 2: no communication forward; their replicated weights' gradients are partial sums
        # over the heads, all-reduced (torchtitan's qwen3 plan: SequenceParallel(sequence_dim=2)
        # on q_norm and k_norm, with or without sequence parallelism).
        plan |= {f"attn.{p}_norm": SequenceParallel(sequence_dim=2, use_local_output=True)
                 for p in "qk"}
    if sequence_parallel:
        plan |= {"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
                 "mlp": PrepareModuleInput(input_layouts=(Shard(1),),
                                           desired_input_layouts=(Replicate(),)) if moe
                 else module_input("mlp", mlp_inputs, 1)}
    elif not moe:
        plan["mlp"] = module_input("mlp", mlp_inputs, 1)
    elif "mlp.shared.up_proj" in plan:
        # A MoE's router and routed experts read the MLP input as it is; its shared experts
        # take it once, as the dense MLP does (one input-gradient all-reduce, one fp8 cast).
        plan["mlp.shared"] = module_input("mlp.shared", mlp_inputs, 1)
    return plan


def float8_styles() -> tuple[type, type, type]:
    """torchao's float8 tensor-parallel styles: (``Float8ColwiseParallel``,
    ``Float8RowwiseParallel``, ``PrepareFloat8ModuleInput``). Imported here, not at the top:
    only a model that already holds torchao's ``Float8Linear`` modules asks, so torchao is
    loaded by then."""
    # Here: torchao takes 1.8 s to import, which only fp8 runs pay (they have paid it).
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )
    return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput


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
    if loss_parallel and shape.tied:
        raise SpecError("loss_parallel", True, "needs an untied head (the model's shape is "
                        "tied: the shared embedding/head weight stays replicated under "
                        "tensor parallelism, so its logits are never vocab-sharded)")
    plan: dict[str, ParallelStyle] = {}
    scatter_late = sequence_parallel and scatters_at_blocks(shape)
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
            loss_parallel: bool = False, layers: Sequence[int] | None = None,
            fp8: Mapping[int, frozenset[str]] | None = None) -> dict[str, ParallelStyle]:
    """The whole declarative plan for ``parallelize_module(model, tp_mesh, plan)``.

    :func:`root_plan` plus :func:`block_plan` with every key prefixed ``blocks.*.``
    (``parallelize_module`` matches ``*`` against child names with ``fnmatch``), so the
    values are ``ParallelStyle`` objects keyed by module path. As torchtitan's
    ``apply_tp``, with shardlab's module names. A mixture-of-experts model's dense and
    MoE blocks differ, so its blocks are named one by one: ``layers``, the layer indices
    the module holds (all of them by default; a pipeline stage's own). So are they when
    ``fp8`` names, per layer index, the block sub-modules that are fp8 linears
    (:func:`block_plan`).
    """
    plan = root_plan(shape, sequence_parallel, loss_parallel)
    if shape.moe is None and not fp8:
        plan |= {f"blocks.*.{k}": v for k, v in block_plan(shape, sequence_parallel).items()}
        return plan
    first_moe = shape.layers - shape.moe_layers
    for i in range(shape.layers) if layers is None else layers:
        styles = block_plan(shape, sequence_parallel, shape.moe is not None and i >= first_moe,
                            (fp8 or {}).get(i, frozenset()))
        plan |= {f"blocks.{i}.{k}": v for k, v in styles.items()}
    return plan


def check_tp(shape: ModelShape, tp: int) -> None:
    """Raise SpecError unless ``tp`` splits the heads, kv heads, d_ff (and vocab, untied)."""
    require_positive_int("tp", tp)
    widths = {"heads": shape.heads, "kv_heads": shape.kv_heads, "d_ff": shape.d_ff}
    if shape.moe is not None and shape.moe.shared_experts:
        widths["shared width"] = shape.moe.shared_experts * shape.moe.shared_d_ff
    for field, n in widths.items():
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
    shape: ModelShape = model.shape  # type: ignore[assignment]
    tp = tp_mesh.size()
    check_tp(shape, tp)
    if tp == 1:
        if sequence_parallel or loss_parallel:
            raise SpecError("tp", 1, "sequence/loss parallelism need tp > 1")
        return model
    blocks = named_blocks(model)
    layers = [int(key) for key, _ in blocks]
    fp8 = {int(key): frozenset(name for name, m in block.named_modules()
                               if type(m).__name__ == "Float8Linear")
           for key, block in blocks}
    parallelize_module(model, tp_mesh, tp_plan(shape, sequence_parallel, loss_parallel,
                                               layers, {k: v for k, v in fp8.items() if v}))
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
    if not isinstance(logits, DTensor):
        return lm_loss_sum(logits, targets, loss_mask)
    masked = torch.where(loss_mask.bool(), targets, torch.full_like(targets, IGNORE_INDEX))
    return nn.functional.cross_entropy(loss_logits(logits).flatten(0, 1), masked.flatten(),
                                       reduction="sum", ignore_index=IGNORE_INDEX)
