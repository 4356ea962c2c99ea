"""Activation checkpointing trades memory for recomputation, and changes no number.

A tiny shardlab :class:`TransformerLM` runs forward and backward on a garden batch twice:
once plainly and once with every block wrapped in
``torch.utils.checkpoint.checkpoint(block, ..., use_reentrant=False)``. Measured:

* bytes kept for backward. :func:`torch.autograd.graph.saved_tensors_hooks` sees every
  tensor autograd saves; several saved tensors may share one storage (``x * x`` saves
  ``x`` twice, a transpose is a view), so storages are counted once, keyed by
  ``untyped_storage().data_ptr()``, and parameter storages are left out (they live
  anyway). Inside a checkpointed region the checkpoint's own, inner saved-tensor hooks
  take precedence, so the outer hook does not see them; the checkpoint instead keeps its
  *inputs* (the hidden state, the mask and the rotary tables) to rerun the block, and
  those storages are added. This is only what the forward keeps for backward, not the
  peak memory of the process (backward's recomputation and gradients come on top);
* block forward calls, counted by a forward pre-hook on each block (removed after): with
  checkpointing every block runs twice, once in forward and once, recomputed, in
  backward. The count says nothing about how much work each call does.

Checks: ``saved_bytes_fall`` (checkpointed / plain kept bytes < 1; the ratio is the
value), ``block_forwards_double`` (calls with checkpointing = 2 x layers, plain =
layers), ``outputs_equal`` (max |logits diff| <= 1e-6 in fp32; recomputation on CPU is
deterministic, so it is 0 in practice) and ``grads_equal`` (every parameter has a
gradient in both runs; max |diff| over all of them <= 1e-6).

Rank-local: every rank computes the same thing, no collective. Writes nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from shardlab.config.model import ModelShape
from shardlab.distributed.launch import RankContext
from shardlab.nn.data import Batch, make_batch
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import TransformerLM
from shardlab.verify.registry import check

SHAPE = ModelShape("ckpt-tiny", 4, 32, 4, garden_vocab().size, 64, style="llama", tied=False)
MODEL_SEED, DOC_SEED, DOCS = 11, 5, 4
EQUAL_TOL = 1e-6  # fp32; recomputation is bitwise-deterministic on CPU, so 0 is expected


@dataclass(frozen=True)
class Measurement:
    """One forward + backward: what was kept for backward, how often blocks ran, results."""

    saved_bytes: int  # unique non-parameter storages the saved-tensor hooks saw
    held_input_bytes: int  # unique storages a checkpoint kept as inputs (0 without)
    block_calls: int  # forward calls of the blocks, recomputation included
    logits: torch.Tensor
    grads: list[torch.Tensor | None]  # by model.parameters() order

    @property
    def kept_bytes(self) -> int:
        """Everything the forward kept for backward: saved tensors plus checkpoint inputs."""
        return self.saved_bytes + self.held_input_bytes


class Checkpointed(nn.Module):
    """Runs ``inner`` under non-reentrant checkpointing; records its inputs' storages."""

    def __init__(self, inner: nn.Module, held: dict[int, int]) -> None:
        super().__init__()
        self.inner = inner
        self._held = held

    def forward(self, *args: object) -> torch.Tensor:
        """``inner(*args)``, keeping only the inputs; activations are recomputed."""
        for a in _tensors(args):
            if torch.is_grad_enabled():
                self._held[a.untyped_storage().data_ptr()] = a.untyped_storage().nbytes()
        return checkpoint(self.inner, *args, use_reentrant=False)


def _tensors(args: object) -> list[torch.Tensor]:
    """The tensors in ``args`` (nested tuples and lists flattened)."""
    if isinstance(args, torch.Tensor):
        return [args]
    if isinstance(args, tuple | list):
        return [t for a in args for t in _tensors(a)]
    return []


def garden_batch() -> Batch:
    """A few garden documents of different lengths, right-padded."""
    docs = garden_documents(DOCS, seed=DOC_SEED)
    return make_batch(docs, max(map(len, docs)) - 1)


def measure(model: TransformerLM, batch: Batch, checkpointed: bool) -> Measurement:
    """Forward and backward of a copy of ``model`` on ``batch`` (mean loss over real
    tokens), with or without each block checkpointed. ``model`` itself is untouched."""
    model = copy.deepcopy(model)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}
    held: dict[int, int] = {}
    calls = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    def count(module: nn.Module, args: object) -> None:
        calls[0] += 1

    blocks = list(model.blocks)
    handles = [b.register_forward_pre_hook(count) for b in blocks]
    try:
        if checkpointed:
            model.blocks = nn.ModuleList(Checkpointed(b, held) for b in blocks)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(batch.input_ids, batch.pad_mask)
            loss = lm_loss_sum(logits, batch.targets, batch.loss_mask) / batch.real_tokens
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    held = {k: v for k, v in held.items() if k not in params}
    grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    return Measurement(sum(saved.values()), sum(held.values()), calls[0], logits.detach(),
                       grads)


def _max_grad_diff(a: Measurement, b: Measurement) -> float:
    """max |diff| over every parameter's gradient; inf when either run lacks one."""
    if any(g is None for g in a.grads + b.grads) or len(a.grads) != len(b.grads):
        return float("inf")
    return max(float((x - y).abs().max()) for x, y in zip(a.grads, b.grads, strict=True))


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """Plain vs per-block checkpointed forward/backward of the same model on one batch."""
    device = torch.device(ctx.device)
    model = TransformerLM(SHAPE, seed=MODEL_SEED).to(device)
    b = garden_batch()
    batch = Batch(*(t.to(device) for t in (b.input_ids, b.targets, b.loss_mask, b.pad_mask)))
    plain = measure(model, batch, checkpointed=False)
    ckpt = measure(model, batch, checkpointed=True)
    ratio = ckpt.kept_bytes / plain.kept_bytes
    layers = SHAPE.layers
    return [
        check("saved_bytes_fall", ratio, 1.0, passed=ratio < 1.0,
              detail=f"kept for backward: plain {plain.kept_bytes} B, checkpointed "
                     f"{ckpt.kept_bytes} B = {ckpt.saved_bytes} B saved outside the blocks + "
                     f"{ckpt.held_input_bytes} B of block inputs the checkpoints hold; ratio "
                     f"{ratio:.3f} (unique non-parameter storages; not the process peak)"),
        check("block_forwards_double", ckpt.block_calls, 2 * layers,
              passed=ckpt.block_calls == 2 * layers and plain.block_calls == layers,
              detail=f"block forward calls: plain {plain.block_calls}, checkpointed "
                     f"{ckpt.block_calls} ({layers} blocks; each recomputed once in backward)"),
        check("outputs_equal", float((plain.logits - ckpt.logits).abs().max()), EQUAL_TOL,
              detail="max |logits diff|, fp32"),
        check("grads_equal", _max_grad_diff(plain, ckpt), EQUAL_TOL,
              detail=f"max |grad diff| over all {len(plain.grads)} parameters, fp32"),
    ]
