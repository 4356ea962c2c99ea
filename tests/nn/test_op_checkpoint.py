"""torchtitan's per-operator selective checkpointing, run by torch on shardlab's Llama block,
keeps what :func:`shardlab.estimate.activations.op_checkpoint_layer_bytes` counts.

The policy is torchtitan's (``parallelize_llama.py`` ``_custom_policy``, as
:func:`~shardlab.estimate.activations.op_checkpoint_saves` cites it): save every
attention kernel's outputs and every ``aten.mm`` output but each second one, a fresh
count per block; recompute the rest. On the CPU the attention kernel is
``_scaled_dot_product_flash_attention_for_cpu``. What the block keeps after its forward
is read as the storages of the tensors alive then (the checkpoint's input and the
policy's cache are Python objects), less those alive before."""

from __future__ import annotations

import functools
import gc
from collections import defaultdict
from typing import Any

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from shardlab.config.model import ModelShape
from shardlab.estimate.activations import op_checkpoint_layer_bytes
from shardlab.nn.model import TransformerLM

MM = torch.ops.aten.mm.default
SAVED_OPS = {MM, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}


def torchtitan_policy(meta: dict[str, int]) -> Any:
    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        key = ("recompute" if ctx.is_recompute else "forward") + "_mm_count"
        if func == MM:
            meta[key] += 1
        save = func in SAVED_OPS and not (func == MM and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def live_storages() -> dict[int, int]:
    """Bytes of every storage a live tensor (not a parameter) holds, by storage."""
    gc.collect()
    out = {}
    for obj in gc.get_objects():
        if type(obj) is torch.Tensor:
            storage = obj.untyped_storage()
            out[storage._cdata] = storage.nbytes()
    return out


def test_per_op_checkpointing_keeps_what_the_count_says() -> None:
    shape = ModelShape("t", 1, 256, 4, vocab=256, context=256, style="llama", tied=False,
                       d_ff=768, kv_heads=2)
    torch.manual_seed(0)
    block = TransformerLM(shape).to(torch.bfloat16).blocks[0]
    x = torch.randn(2, 256, 256, dtype=torch.bfloat16, requires_grad=True)
    before = live_storages()
    context = functools.partial(create_selective_checkpoint_contexts,
                                torchtitan_policy(defaultdict(int)))
    out = checkpoint(lambda y: block(y, None), x, use_reentrant=False, context_fn=context)
    kept = {k: v for k, v in live_storages().items()
            if k not in before and k != out.untyped_storage()._cdata}
    measured = sum(kept.values()) + x.untyped_storage().nbytes()  # the checkpoint's input
    counted = op_checkpoint_layer_bytes(shape, 2, 256, 2)
    # Within 0.5%: torch also keeps a few small tensors of its own (5 KB here: 0.26%).
    assert abs(measured / counted - 1) < 0.005, (measured, counted, sorted(kept.values()))
    # And the policy kept what it should: q, v, gate and down, the kernel's output and
    # its fp32 log-sum-exp (the four 262,144-byte tensors are q, down, the kernel's
    # output, and the input counted above).
    big = sorted(v for v in kept.values() if v > 100_000)
    assert big == [131072, 262144, 262144, 262144, 786432]
    out.float().sum().backward()  # the recompute runs: the saved set was enough
    assert x.grad is not None and torch.isfinite(x.grad).all()
