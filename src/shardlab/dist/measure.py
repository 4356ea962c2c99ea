"""What a real run sends and holds, measured in the run.

:class:`CommMeter` is a ``TorchDispatchMode`` that sees every collective that goes
through the dispatcher: DTensor's functional collectives (``_c10d_functional``) and
the in-place c10d ops FSDP2 and DDP's hooks call (``c10d``), the same hook
``torch.distributed.tensor.debug.CommDebugMode`` uses to count them. For each it
records the payload (bytes of the tensor handed to the collective) and the bytes a
ring algorithm makes this rank send for it (Thakur et al. 2005): all-reduce
2(p-1)/p·n, all-gather and reduce-scatter (p-1)/p·n of the full tensor, a
broadcast's n from the root. Point-to-point sends of pipeline stages are counted by
:func:`count_p2p` around the schedule's step.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# op name -> (kind, which argument holds the payload, payload is the gathered output?)
_OPS = {
    "all_reduce": ("all_reduce", 0, False),
    "allreduce_": ("all_reduce", 0, False),
    "all_reduce_coalesced": ("all_reduce", 0, False),
    "allreduce_coalesced_": ("all_reduce", 0, False),
    "all_gather_into_tensor": ("all_gather", 0, False),
    "all_gather_into_tensor_coalesced": ("all_gather", 0, False),
    "_allgather_base_": ("all_gather", 1, False),
    "allgather_into_tensor_coalesced_": ("all_gather", 1, False),
    "reduce_scatter_tensor": ("reduce_scatter", 0, False),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0, False),
    "_reduce_scatter_base_": ("reduce_scatter", 1, False),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, False),
    "broadcast": ("broadcast", 0, False),
    "broadcast_": ("broadcast", 0, False),
    "all_to_all_single": ("all_to_all", 0, False),
    "alltoall_base_": ("all_to_all", 1, False),
}


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, list | tuple):
        return sum(_nbytes(t) for t in x)
    return 0


def _group_size(args: tuple, kwargs: dict) -> int:
    """Ranks in the collective's group: a ProcessGroup object (c10d ops) or a group name
    (functional collectives, DTensor's)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.ScriptObject) and hasattr(a, "size"):
            try:
                return int(a.size())
            except (RuntimeError, TypeError):
                continue
        if isinstance(a, str):
            try:
                return int(_resolve_process_group(a).size())
            except (RuntimeError, ValueError, KeyError):
                continue
    return dist.get_world_size()


def ring_bytes(kind: str, payload: int, p: int) -> float:
    """Bytes this rank sends for one collective with ``payload`` bytes on p ranks (ring).

    For all-gather the payload is this rank's input (the output is p times it); for
    reduce-scatter it is the full input.
    """
    if p <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (p - 1) / p * payload
    if kind == "all_gather":
        return (p - 1) * payload
    if kind in ("reduce_scatter", "all_to_all"):
        return (p - 1) / p * payload
    return float(payload)  # broadcast: sent by the root, counted where it is called


class CommMeter(TorchDispatchMode):
    """Count every dispatched collective: calls, payload bytes, ring bytes sent, by kind.

    Point-to-point sends (pipeline stages) do not pass the dispatcher: while the meter
    is active, ``torch.distributed.isend`` (which ``batch_isend_irecv`` and the
    pipelining schedules call) is wrapped to count what it sends as kind ``send``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.payload: dict[str, int] = defaultdict(int)
        self.sent: dict[str, float] = defaultdict(float)
        self._original: Any = None

    def __enter__(self) -> CommMeter:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        self._original = c10d.isend

        def counting_isend(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            n = _nbytes(tensor)
            self.calls["send"] += 1
            self.payload["send"] += n
            self.sent["send"] += n
            return self._original(tensor, *args, **kwargs)

        # Both names: torch.distributed re-exports isend, and P2POp checks against c10d's.
        dist.isend = c10d.isend = counting_isend
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        super().__exit__(*exc)
        dist.isend = c10d.isend = self._original

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        namespace = getattr(func, "namespace", "")
        if namespace in ("_c10d_functional", "c10d") and name in _OPS:
            kind, arg, _ = _OPS[name]
            payload = _nbytes(args[arg]) if len(args) > arg else 0
            p = _group_size(args, kwargs)
            self.calls[kind] += 1
            self.payload[kind] += payload
            self.sent[kind] += ring_bytes(kind, payload, p)
        return func(*args, **kwargs)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per kind: calls, payload bytes, bytes sent (ring)."""
        return {k: {"calls": self.calls[k], "payload_bytes": self.payload[k],
                    "sent_bytes": self.sent[k]} for k in sorted(self.calls)}


def saved_activation_bytes(fn: Any, exclude: set[int] | None = None) -> tuple[Any, int]:
    """Run ``fn()`` and return (its result, bytes of distinct storages autograd saved for
    backward, not counting storages in ``exclude`` (parameters)): the saved-tensor-hooks
    measurement of seed 002."""
    seen: dict[int, int] = {}
    skip = exclude or set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.nn.Parameter):  # weights (FSDP's unsharded ones too)
            return t
        local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's part
        try:
            storage = local.untyped_storage()
            key = storage.data_ptr()
            if key not in skip and key != 0:
                seen[key] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # DTensor or a tensor without storage
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def flop_counter() -> Any:
    """``FlopCounterMode`` that also counts the CPU fused attention kernel.

    torch 2.13's counter has formulas for the CUDA SDPA kernels only, so on CPU the
    attention core (4·s·d per token and layer forward) would go uncounted; this maps
    ``_scaled_dot_product_flash_attention_for_cpu`` and its backward to the same
    formulas (full s x s, as the cost model counts it by default).
    """
    from torch.utils.flop_counter import (
        FlopCounterMode,
        sdpa_backward_flop_count,
        sdpa_flop_count,
    )

    aten = torch.ops.aten

    def forward(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
        return sdpa_flop_count(q, k, v)

    def backward(g: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None,
                 **kw: Any) -> int:
        return sdpa_backward_flop_count(g, q, k, v)

    mapping = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = forward
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = backward
    return FlopCounterMode(display=False, custom_mapping=mapping)
