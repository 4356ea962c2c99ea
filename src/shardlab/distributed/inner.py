"""The plain tensors that hold a tensor's data, for counting its bytes.

A DTensor holds this rank's shard; a wrapper tensor subclass (torchao's
``Float8TrainingTensor``: 1-byte ``_data`` and a float32 ``_scale``; its fp8-gathered
weight ``WeightWithDynamicFloat8CastTensor``: the weight as ``_tensor``) holds inner
tensors, named by its ``__tensor_flatten__``. The wrapper's own storage, which
``_make_wrapper_subclass`` sizes by the *outer* dtype (bf16 for a float8 tensor), holds
nothing: counted in its place, an fp8 activation read as 2 bytes an element.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def data_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding ``t``'s data on this rank: ``t`` itself, a DTensor's
    local shard, or a wrapper subclass's inner tensors (recursively), in flatten order."""
    if isinstance(t, DTensor):
        return data_tensors(t.to_local())
    if is_traceable_wrapper_subclass(t) and not isinstance(t, FakeTensor):
        names, _ = t.__tensor_flatten__()
        return [x for name in names for x in data_tensors(getattr(t, name))]
    return [t]
