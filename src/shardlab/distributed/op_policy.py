"""torchtitan's per-operator selective activation checkpointing policy, for torch's
selective checkpoint contexts (``recompute=op``,
:func:`shardlab.distributed.activation_checkpoint.apply_ac`).

Inside a checkpointed block, torch asks the policy about every operator its forward runs.
The outputs of the ops it saves are cached in forward and handed back when backward runs
the block again; every other op is run again. The policy is torchtitan's ``SelectiveAC``
(``torchtitan/distributed/activation_checkpoint.py`` at b5bcd76c, ``_get_custom_policy``),
written anew here:

* saved: the compute-intensive ops of torch's partitioner
  (``torch._functorch.partitioners.get_default_op_list().compute_intensive_ops``: mm,
  addmm, bmm, the fused attention kernels, ``_scaled_mm``), ``aten.max`` (an fp8 scale's
  amax), ``aten.linear``, ``aten.topk``, the math and cuDNN attention kernels, and the
  communication ops whose outputs would cost a second collective
  (``reduce_scatter_tensor``, ``all_to_all_single``);
* except every second ``aten.mm`` (or ``aten.linear``) of a block's forward, counted
  afresh for each call of the block, and apart for its recompute, so the 2nd, 4th, 6th
  ... are run again. ``addmm`` (a linear with a bias) is saved without being counted.

One addition: torch's CPU flash-attention kernel
(``_scaled_dot_product_flash_attention_for_cpu``), which stands on the CPU for the CUDA
one the list names, so a CPU run keeps what a GPU run keeps. The bytes this keeps are
counted by :func:`shardlab.estimate.activations.op_checkpoint_layer_bytes` (measured
equal, ``tests/distributed/test_op_policy.py``). torchtitan's MoE-only rules (the
router's matmul always run again, device-to-host copies saved) have no dense
counterpart and are not built: ``apply_ac`` refuses ``op`` for MoE blocks.

:data:`SAC_CACHES` lets a meter see the cache: while it holds a list, each context made
appends its cache (a dict of op -> {call: outputs}), which torch's saved-tensor hooks do
not see (:mod:`shardlab.distributed.saved`).
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

import torch
from torch._functorch.partitioners import get_default_op_list
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

MM_OPS = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)

SAC_CACHES: contextvars.ContextVar[list[dict[Any, dict[int, Any]]] | None] = (
    contextvars.ContextVar("sac_caches", default=None))


@functools.cache
def saved_ops() -> frozenset[Any]:
    """The ops whose outputs the policy saves (module docstring), this torch's."""
    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    ops |= {aten._scaled_dot_product_cudnn_attention.default,
            aten._scaled_dot_product_attention_math.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten.max.default, aten.linear.default, aten.topk.default,
            c10d.reduce_scatter_tensor.default, c10d.all_to_all_single.default}
    return frozenset(ops)


def op_policy() -> Any:
    """A fresh policy (its own matmul counts) for one call of a block."""
    counts = {"forward": 0, "recompute": 0}
    save = saved_ops()

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func not in save:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if func in MM_OPS:
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    return policy


def op_checkpoint_context() -> tuple[Any, Any]:
    """``context_fn`` of a block's non-reentrant checkpoint: torch's selective-checkpoint
    contexts under :func:`op_policy`, the cache shown to a meter (:data:`SAC_CACHES`)."""
    contexts = create_selective_checkpoint_contexts(op_policy())
    caches = SAC_CACHES.get()
    if caches is not None:
        # torch's caching mode keeps its outputs in ``storage`` (op -> {call: outputs}).
        caches.append(contexts[0].storage)
    return contexts
