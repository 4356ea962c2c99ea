"""Activation checkpointing of shardlab's :class:`~shardlab.nn.model.TransformerLM` blocks.

What a block keeps for backward, traded for recomputation (torchtitan's ``apply_ac``):
``full`` wraps every block in torch's non-reentrant ``checkpoint_wrapper`` (only its input
is kept, its forward re-run in backward); ``selective`` recomputes only the attention
core, through the model's own flag (Korthikanti et al. 2022). It is the second step of
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

from shardlab.errors import SpecError

AcMode = Literal["none", "selective", "full"]
AC_MODES: tuple[str, ...] = ("none", "selective", "full")


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
    if mode not in AC_MODES:
        raise SpecError("ac", mode, f"must be one of {', '.join(AC_MODES)}")
    blocks = model.blocks
    for key, block in named_blocks(model):
        if mode == "full" and not isinstance(block, CheckpointWrapper):
            blocks[key] = checkpoint_wrapper(  # type: ignore[index]
                block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
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
