"""Peak memory of one rank's step by category, with torch's own trackers.

``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` (FSDP2 programs) or
``torch.distributed._tools.mem_tracker.MemTracker`` (DDP, or no data parallelism) sees
every storage the step creates, on fake tensors too (its ``active_fake_mode`` check
skips DTensor's own shape-propagation ops), and files it under a reference type. Those
types fold into the five categories the cost model speaks of (:data:`FOLD`):

* ``params``: sharded parameters and buffers;
* ``grads``: the sharded (FSDP) or whole gradients;
* ``optimizer``: AdamW's moments;
* ``activations``: what the forward creates and keeps (and the step's inputs);
* ``temporaries``: everything else alive at that moment: FSDP's gathered (unsharded)
  parameters and gradients and its all-gather and reduce-scatter buffers, and the
  backward's activation gradients.

:class:`RoleTracker` also records the peak's moment (forward, backward or optimizer,
and the innermost module running) and the largest activation figure of the step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed._tools.fsdp2_mem_tracker import (
    FSDPMemTracker,
    _FSDPRefType,
    _SavedFSDPMethods,
)
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks

from shardlab.dryrun.compare import CATEGORIES

FOLD = {
    # FSDPMemTracker's _FSDPRefType
    "Sharded Param": "params", "Buffer": "params", "Sharded Grad": "grads",
    "OptState": "optimizer", "Activation": "activations", "Inputs": "activations",
    "Unsharded Param": "temporaries", "Unsharded Grad": "temporaries", "Temp": "temporaries",
    "All Gather": "temporaries", "Reduce Scatter": "temporaries",
    # MemTracker's _MemRefType
    "Parameter": "params", "Gradient": "grads", "Optstate": "optimizer", "Other": "temporaries",
}
"""torch's reference types (by value) -> shardlab's categories."""

_TOTAL = "Total"


def fold(snapshot: dict[Any, int]) -> dict[str, int]:
    """A tracker's per-device snapshot ``{reftype: bytes, "Total": bytes}`` in
    :data:`CATEGORIES` (every reference type must be known: a new one in torch fails
    here, not silently)."""
    out = dict.fromkeys(CATEGORIES, 0)
    for key, value in snapshot.items():
        name = getattr(key, "value", key)
        if name == _TOTAL:
            continue
        out[FOLD[name]] += int(value)
    return out


_AGAIN = "shardlab: a module's next micro-batch"
"""Put among the running modules' names while a module that has already run goes forward
again: torch's trackers take a root module's second forward for a new iteration and
refuse it, but a step's micro-batches (accumulation, pipeline schedules) run the same
modules many times within one step, which their submodule path (a module used twice in
one iteration) tracks as it should."""


def _again(tracker: Any, call: Any, *args: Any, **kwargs: Any) -> Any:
    parents = tracker._mod_tracker.parents
    added = _AGAIN not in parents
    parents.add(_AGAIN)
    try:
        return call(*args, **kwargs)
    finally:
        if added:
            parents.discard(_AGAIN)


class _Moments:
    """The peak's moment and the largest activation figure, updated on every new peak."""

    def _init_moments(self) -> None:
        self.moment: dict[str, str] = {"phase": "", "module": ""}
        self.activation_peak = 0

    def _note(self, tracker: Any) -> None:
        snap = next(iter(tracker._curr_mem_snap.values()), None)
        if snap is None:
            return
        act = sum(v for k, v in snap.items() if FOLD.get(getattr(k, "value", k))
                  == "activations")
        self.activation_peak = max(self.activation_peak, act)
        peak = next(iter(tracker._peak_mem.values()), 0)
        if snap.get(_TOTAL, 0) == peak and peak > self._last_peak:
            self._last_peak = peak
            mods = tracker._mod_tracker
            phase = "optimizer" if tracker._in_opt else "backward" if mods.is_bw else "forward"
            inner = max((p for p in mods.parents if p != "Global"), key=len, default="")
            self.moment = {"phase": phase, "module": inner}


def _forward_hooks(state: Any, pre: Any, post: Any) -> None:
    """Register ``pre`` and ``post`` as an FSDP unit's forward hooks where
    ``FSDPState.init`` registers its own: on its module (the post hook always called, as
    torch's tracker registers its wrappers), or torch's group hooks over a unit of several
    (which run the unit's work once, around its first and last module)."""
    modules = state._modules
    if len(modules) == 1:
        state._pre_forward_hook_handle = modules[0].register_forward_pre_hook(
            pre, prepend=True, with_kwargs=True)
        state._post_forward_hook_handle = modules[0].register_forward_hook(
            post, prepend=False, always_call=True)
        return
    handle = _register_group_forward_hooks(modules, pre, post, state._modules_to_run_forward,
                                           state._cast_output_dtype)
    state._pre_forward_hook_handle = state._post_forward_hook_handle = handle


class _FSDPRoleTracker(FSDPMemTracker, _Moments):
    """FSDPMemTracker over every FSDP root of the rank (pipeline stages are separate
    roots; torch's tracker takes one, so the roots are listed in a ModuleList, which
    changes nothing in them)."""

    def __init__(self, modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> None:
        super().__init__(modules[0], optimizer)
        self._root_mod = nn.ModuleList(modules)
        self._init_moments()
        self._last_peak = 0

    def _update_peak_stats(self, peak_state: Any) -> None:
        super()._update_peak_stats(peak_state)
        self._note(self)

    def _instrument_fsdp_module(self) -> None:
        """torch's instrumenting, once per FSDP unit: torch's own wraps each module of a
        unit of several (the final norm with the head, :func:`shardlab.distributed.
        data_parallel.apply_fsdp`) on its own, so the unit's hooks ran once per module,
        gathering and reducing it twice. Here a unit of several modules gets torch's
        group hooks back around the tracker's wrappers, keyed by its first module."""
        states: dict[int, Any] = {}
        for module in self._root_mod.modules():
            if isinstance(module, FSDPModule):
                state = module._get_fsdp_state()
                if state._fsdp_param_group is not None:
                    states.setdefault(id(state), state)
        for state in states.values():
            state._pre_forward_hook_handle.remove()
            state._post_forward_hook_handle.remove()
        for state in states.values():
            first, group = state._modules[0], state._fsdp_param_group
            self._instrument_fsdp_sharded_params_grads(group)
            _forward_hooks(state, self._fsdp_state_pre_forward(first, state._pre_forward),
                           self._fsdp_state_post_forward(first, state._post_forward))
            self._fsdp_mod_to_saved_methods[first] = _SavedFSDPMethods(
                group.pre_backward, group.post_backward)
            group.pre_backward = self._fsdp_param_group_pre_backward(first, group.pre_backward)
            group.post_backward = self._fsdp_param_group_post_backward(
                first, group.post_backward)
        for buffer in self._root_mod.buffers():
            self._update_and_maybe_create_winfos(buffer, _FSDPRefType.BUFFER)

    def _deregister_module_and_optimizer_hooks(self) -> None:
        """torch's undoing, with each unit's own forward hooks put back (a unit of several
        modules gets torch's group hooks again, as ``FSDPState.init`` registers them)."""
        saved, self._fsdp_mod_to_saved_methods = self._fsdp_mod_to_saved_methods, {}
        super()._deregister_module_and_optimizer_hooks()  # the optimizer's hooks
        for first, methods in saved.items():
            state = first._get_fsdp_state()
            state._pre_forward_hook_handle.remove()
            state._post_forward_hook_handle.remove()
            _forward_hooks(state, state._pre_forward, state._post_forward)
            state._fsdp_param_group.pre_backward = methods.pre_backward
            state._fsdp_param_group.post_backward = methods.post_backward

    def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:
        inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

        def again(*args: Any, **kwargs: Any) -> Any:
            if fsdp_mod in self.memory_tracking and not self._mod_tracker.is_bw:
                return _again(self, inner, *args, **kwargs)
            return inner(*args, **kwargs)

        return again


class _PlainRoleTracker(MemTracker, _Moments):
    """MemTracker over the rank's modules and optimizer (no FSDP)."""

    def __init__(self, modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> None:
        super().__init__()
        self.track_external(*modules, optimizer)
        self._init_moments()
        self._last_peak = 0

    def _update_peak_stats(self, peak_state: Any) -> None:
        super()._update_peak_stats(peak_state)
        self._note(self)

    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            _again(self, super()._pre_fw_hook, module, inputs)
        else:
            super()._pre_fw_hook(module, inputs)


def role_tracker(modules: list[nn.Module], optimizer: torch.optim.Optimizer,
                 inputs: tuple[Any, ...]) -> Any:
    """The tracker for a rank's program: FSDP's when its modules are FSDP2 roots."""
    if all(isinstance(m, FSDPModule) for m in modules):
        tracker: Any = _FSDPRoleTracker(modules, optimizer)
        tracker.track_inputs(inputs)
        return tracker
    tracker = _PlainRoleTracker(modules, optimizer)
    tracker.track_external(*inputs)
    return tracker


def peak_breakdown(tracker: Any) -> tuple[int, dict[str, int], dict[str, int]]:
    """(peak bytes, the peak in :data:`CATEGORIES`, the peak in torch's own reference
    types) of a tracker that has run (one device: the fake CPU one)."""
    snap = next(iter(tracker.get_tracker_snapshot("peak").values()), {})
    raw = {getattr(k, "value", k): int(v) for k, v in snap.items() if k != _TOTAL}
    return int(snap.get(_TOTAL, 0)), fold(snap), raw
