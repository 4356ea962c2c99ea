"""Activation checkpointing of shardlab's :class:`~shardlab.nn.model.TransformerLM` blocks.

What a block keeps for backward, traded for recomputation (torchtitan's ``apply_ac``):
``full`` wraps every block in torch's non-reentrant ``checkpoint_wrapper`` (only its input
is kept, its forward re-run in backward); ``selective`` recomputes only the attention
core, through the model's own flag (Korthikanti et al. 2022); ``op`` is torchtitan's
per-operator selective checkpointing (its ``SelectiveAC``, the policy
:mod:`shardlab.distributed.op_policy` states), the block wrapped as under ``full`` but
with torch's selective-checkpoint contexts, so the outputs the policy saves are cached in
forward and reused when backward runs the block again. It is the second step of
:func:`shardlab.distributed.parallelize.parallelize`, after tensor parallelism.
"""

from __future__ import annotations

from typing import Any, Literal

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)

from shardlab.distributed.op_policy import op_checkpoint_context
from shardlab.errors import SpecError
from shardlab.nn.mlp import MLP

AcMode = Literal["none", "selective", "full", "op"]
AC_MODES: tuple[str, ...] = ("none", "selective", "full", "op")


def _inner(block: nn.Module) -> nn.Module:
    """The block under a checkpoint wrapper (or the block itself)."""
    return getattr(block, "_checkpoint_wrapped_module", block)


def apply_ac(model: nn.Module, mode: AcMode) -> nn.Module:
    """Activation checkpointing of every block (torchtitan's ``apply_ac``), in place.

    ``full``: each ``model.blocks[i]`` replaced by ``checkpoint_wrapper(block)``
    (non-reentrant): only the block's input is kept, its forward re-run in backward.
    ``op``: the same wrapper with torchtitan's per-operator policy as its ``context_fn``
    (:func:`~shardlab.distributed.op_policy.op_checkpoint_context`), a fresh count of
    matmuls per call; MoE blocks are refused (their experts are a loop of per-expert
    matmuls here, not torchtitan's grouped one, so the policy would save another set).
    ``selective``: ``block.attn.recompute_core = True`` (Korthikanti et al. 2022's
    selective recomputation of the attention core's ``s x s`` intermediates; the model
    implements it). ``none``: nothing. Parameter names under ``full`` gain the wrapper's
    ``_checkpoint_wrapped_module.`` segment (its state-dict hook strips it again).
    """
    if mode not in AC_MODES:
        raise SpecError("ac", mode, f"must be one of {', '.join(AC_MODES)}")
    blocks = model.blocks
    if mode == "op" and any(not isinstance(getattr(_inner(b), "mlp", None), MLP)
                            for _, b in named_blocks(model)):
        raise SpecError("recompute", "op", "is built for dense blocks only (a MoE layer's "
                        "experts are a loop of matmuls here); use selective or full")
    for key, block in named_blocks(model):
        if mode in ("full", "op") and not isinstance(block, CheckpointWrapper):
            kw = {"context_fn": op_checkpoint_context} if mode == "op" else {}
            blocks[key] = checkpoint_wrapper(  # type: ignore[index]
                block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kw)
        elif mode == "selective":
            _inner(block).attn.recompute_core = True
    return model


def named_blocks(model: nn.Module) -> list[tuple[Any, nn.Module]]:
    """(key, block) of ``model.blocks``: a ModuleList (the whole model) or a ModuleDict keyed
    by the original layer index (a pipeline stage, :mod:`shardlab.distributed.pipeline`)."""
    blocks = model.blocks
    if isinstance(blocks, nn.ModuleDict):
        return list(blocks.items())
    return list(enumerate(blocks))  # type: ignore[arg-type]
