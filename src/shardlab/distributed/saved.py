"""What a rank keeps for backward, measured with saved-tensor hooks (seed 002's method).

:func:`saved_activation_bytes` counts what one call (a forward) makes autograd save,
:class:`SavedBytesMeter` what every forward of some modules saves (pipeline stages,
whose forwards the schedule calls). Each distinct storage counts once; parameters (and
views of them, such as the ``weight.t()`` a linear keeps) are left out, so the figure
compares with the cost model's activations. Under per-operator checkpointing
(``recompute=op``) what a block keeps is torch's selective-checkpoint cache, which the
hooks do not see (a checkpoint's own hooks stand in for them inside the block): the
caches made while counting (:data:`shardlab.distributed.op_policy.SAC_CACHES`) are
counted with the same rule.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from shardlab.distributed.inner import data_tensors
from shardlab.distributed.op_policy import SAC_CACHES

_WEIGHT_LOCALS: dict[int, weakref.ref[torch.Tensor]] = {}
"""The local tensors of DTensor weights that modules multiply by as plain tensors
(:func:`weight_local`), by id: what autograd saves of them is a weight, not an
activation, though neither it nor its base is a Parameter."""


def weight_local(weight: torch.Tensor) -> torch.Tensor:
    """``weight.to_local()`` for a DTensor weight (the weight itself otherwise), recorded
    so that the meter leaves out the views of it a matmul saves (the expert-parallel
    experts' ``w_up[e]``: until 2026-12-07 counted as activations, 49,152 B a MoE layer of
    issue 16's tiny MoE at ep 2, its four local experts' three 32 x 32 fp32 weights)."""
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    root = local._base if local._base is not None else local
    key = id(root)

    def forget(ref: weakref.ref[torch.Tensor]) -> None:
        # Freed (each forward's to_local() is a new tensor): drop the entry, unless its id
        # was reused by a weight recorded since.
        if _WEIGHT_LOCALS.get(key) is ref:
            del _WEIGHT_LOCALS[key]

    _WEIGHT_LOCALS[key] = weakref.ref(root, forget)
    return local


def _is_weight(t: torch.Tensor) -> bool:
    """A Parameter, a view of one (a linear saves ``weight.t()``), or a view of a DTensor
    weight's local tensor (:func:`weight_local`)."""
    if isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter):
        return True
    base = t._base if t._base is not None else t
    ref = _WEIGHT_LOCALS.get(id(base))
    return ref is not None and ref() is base


def _packer(seen: dict[int, int]) -> Any:
    """A saved-tensor pack hook that records each distinct non-parameter storage's bytes."""

    def pack(t: torch.Tensor) -> torch.Tensor:
        record(t)
        return t

    def record(t: torch.Tensor) -> None:
        # Weights (FSDP's unsharded ones too) and views of them: a linear saves weight.t(),
        # a plain tensor whose base is the Parameter.
        if _is_weight(t):
            return
        # A DTensor: this rank's part; a float8 tensor: its 1-byte data and its scale.
        for local in data_tensors(t):
            try:
                # Keyed by the storage's identity (its StorageImpl), not its data pointer: a
                # fake tensor (the dry run) has none.
                storage = local.untyped_storage()
                if storage.nbytes():
                    seen[storage._cdata] = storage.nbytes()
            except (RuntimeError, NotImplementedError):  # a tensor without storage
                pass

    return pack, record


@contextlib.contextmanager
def _counting(seen: dict[int, int]) -> Iterator[None]:
    """Record into ``seen`` what autograd saves inside the block, and what the
    selective-checkpoint caches made inside it hold (module docstring)."""
    pack, record = _packer(seen)
    caches: list[dict[Any, dict[int, Any]]] = []
    token = SAC_CACHES.set(caches)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
    finally:
        SAC_CACHES.reset(token)
    # torch 2.13 keeps each saved output in a version-checking wrapper (``.val``) and a
    # placeholder object for each output to run again.
    for leaf in tree_leaves([list(c.values()) for cache in caches for c in cache.values()]):
        t = getattr(leaf, "val", None)
        if isinstance(t, torch.Tensor):
            record(t)


def saved_activation_bytes(fn: Any) -> tuple[Any, int]:
    """Run ``fn()`` and return (its result, bytes of distinct storages autograd saved for
    backward, parameters left out): the saved-tensor-hooks measurement of seed 002."""
    seen: dict[int, int] = {}
    with _counting(seen):
        out = fn()
    return out, sum(seen.values())


class SavedBytesMeter:
    """Saved-for-backward bytes of every forward of some modules (pipeline stages, whose
    forwards the schedule calls): each forward's distinct storages are counted on their
    own (nothing saved is freed inside one forward; between forwards of different
    micro-batches a freed storage's address may come back), and summed."""

    def __init__(self) -> None:
        self.total = 0
        self.forwards = 0
        self._open: list[Any] = []
        self._handles: list[Any] = []

    @contextlib.contextmanager
    def count(self) -> Iterator[None]:
        """Count what autograd saves inside the block (e.g. the loss after a stage)."""
        seen: dict[int, int] = {}
        with _counting(seen):
            yield
        self.total += sum(seen.values())

    def attach(self, modules: list[torch.nn.Module]) -> SavedBytesMeter:
        """Count every forward of ``modules`` until :meth:`detach`."""
        def enter(module: Any, args: Any) -> None:
            ctx = self.count()
            ctx.__enter__()
            self._open.append(ctx)
            self.forwards += 1

        def leave(module: Any, args: Any, out: Any) -> None:
            self._open.pop().__exit__(None, None, None)

        for m in modules:
            self._handles += [m.register_forward_pre_hook(enter),
                              m.register_forward_hook(leave)]
        return self

    def detach(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
