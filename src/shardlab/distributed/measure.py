"""What a real run sends and holds, measured in the run.

:class:`CommMeter` is a ``TorchDispatchMode`` that sees every collective that goes
through the dispatcher: DTensor's functional collectives (``_c10d_functional``) and
the in-place c10d ops FSDP2 and DDP's hooks call (``c10d``), the same hook
``torch.distributed.tensor.debug.CommDebugMode`` uses to count them. For each it
records the payload (bytes of the tensor handed to the collective) and the bytes a
ring algorithm makes this rank send for it (Thakur et al. 2005): all-reduce
2(p-1)/p·n, all-gather and reduce-scatter (p-1)/p·n of the full tensor, a
broadcast's n from the root. Point-to-point sends of pipeline stages are counted by
wrapping ``torch.distributed.isend`` while the meter is active.

An all-to-all (expert parallelism's dispatch and combine) is counted from its real
split sizes: the rows this rank sends to every *other* rank times the bytes of a row
(:func:`shardlab.estimate.expert.alltoall_send_bytes`; its own rows are copied locally),
the ring's (p-1)/p·n only when the splits are even (none given).

Each collective is also filed under the mesh dimension whose group ran it (``dp``,
``tp``, ``pp``, ``ep``, ``edp``, matched by the group's ranks; an all-to-all goes to
``ep`` where the ep and dp groups are the same ranks, anything else to the other dim),
or under a label the code set around it with :func:`comm_label` (the gradient-norm
scalars of clipping are ``grad_norm``), so a run's bytes compare with the cost model's
per dimension.

What a rank holds: :func:`state_bytes` its parameters, gradients and optimizer state
(what autograd keeps for backward is :mod:`shardlab.distributed.saved`);
:class:`FlopMeter` counts the FLOPs it computes.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
    shape_wrapper,
)

from shardlab.distributed.inner import data_tensors
from shardlab.estimate.expert import alltoall_send_bytes

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


_LABEL: ContextVar[str | None] = ContextVar("shardlab_comm_label", default=None)


@contextlib.contextmanager
def comm_label(name: str) -> Iterator[None]:
    """File the collectives run inside under ``name`` instead of their mesh dimension."""
    token = _LABEL.set(name)
    try:
        yield
    finally:
        _LABEL.reset(token)


def _wrapper(t: type) -> bool:
    """Whether ``t`` is a tensor subclass that dispatches ops on inner tensors of its own
    (torchao's ``Float8TrainingTensor``): one that defines ``__torch_dispatch__``, other
    than FakeTensor (the dry run's tensors, which hold no inner data) and DTensor (handled
    apart)."""
    return (t not in (torch.Tensor, nn.Parameter, FakeTensor, DTensor)
            and issubclass(t, torch.Tensor) and "__torch_dispatch__" in vars(t))


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, list | tuple):
        return sum(_nbytes(t) for t in x)
    return 0


def _group(args: tuple, kwargs: dict) -> Any:
    """The collective's process group: a ProcessGroup (c10d ops; a script object in older
    torch) or a group name (functional collectives, DTensor's); None when not found."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, dist.ProcessGroup):
            return a
        if isinstance(a, torch.ScriptObject):  # a boxed ProcessGroup, or a ReduceOp
            try:
                return dist.ProcessGroup.unbox(a)
            except (RuntimeError, TypeError):
                continue
        if isinstance(a, str):
            try:
                return _resolve_process_group(a)
            except (RuntimeError, ValueError, KeyError):
                continue
    return None


def _group_size(group: Any) -> int:
    """Ranks in the collective's group."""
    if group is None:
        return dist.get_world_size()
    try:
        return int(group.size())
    except (RuntimeError, TypeError):
        return dist.get_world_size()


def _group_ranks(group: Any) -> tuple[int, ...]:
    """Global ranks of the collective's group (the whole world when unknown), looked up by
    the group's registered name: an unboxed group is a new Python wrapper that c10d's rank
    tables do not know by identity."""
    if group is not None:
        with contextlib.suppress(RuntimeError, TypeError, ValueError, KeyError, AttributeError):
            return tuple(dist.get_process_group_ranks(_resolve_process_group(group.group_name)))
    return tuple(range(dist.get_world_size()))


def _alltoall_sent(name: str, args: tuple, group: Any, payload: int) -> float | None:
    """Bytes this rank sends in an all-to-all with uneven splits: its rows to every other
    rank x the bytes of a row; None when the splits are even (none given: the ring's)."""
    # _c10d_functional.all_to_all_single(input, output_splits, input_splits, group_name);
    # c10d.alltoall_base_(output, input, group, output_splits, input_splits, ...)
    at, data = (2, args[0]) if name == "all_to_all_single" else (4, args[1])
    splits = args[at] if len(args) > at else None
    if not splits or group is None:
        return None
    rows = int(data.shape[0]) if data.dim() else 0
    return float(alltoall_send_bytes([int(n) for n in splits], group.rank(),
                                     payload // rows if rows else 0))


def ring_bytes(kind: str, payload: int, p: int) -> float:
    """Bytes this rank sends for one collective with ``payload`` bytes on p ranks (ring).

    For all-gather the payload is this rank's input (the output is p times it); for
    reduce-scatter it is the full input.
    """
    if p <= 1:
        return 0.0
    # Multiply before dividing: (p - 1) * n / p is exact whenever p divides (p - 1) * n,
    # as it does for FSDP2's padded shards; (p - 1) / p * n can land one ulp off.
    if kind == "all_reduce":
        return 2 * (p - 1) * payload / p
    if kind == "all_gather":
        return (p - 1) * payload
    if kind in ("reduce_scatter", "all_to_all"):
        return (p - 1) * payload / p
    return float(payload)  # broadcast: sent by the root, counted where it is called


class CommMeter(TorchDispatchMode):
    """Count every dispatched collective: calls, payload bytes, ring bytes sent, by kind.

    Point-to-point sends (pipeline stages) do not pass the dispatcher: while the meter
    is active, ``torch.distributed.isend`` (which ``batch_isend_irecv`` and the
    pipelining schedules call) is wrapped to count what it sends as kind ``send``
    (filed under ``pp``).

    ``dims`` names groups by their global ranks (``{"dp": (0, 2), "tp": (0, 1)}``);
    a collective on one of them is filed under its name in ``summary()["by_dim"]``,
    anything else under ``other``. Two dims of the same ranks (dp and ep when
    expert_dp = 1): all-to-alls go to ``ep``, the rest to the other. ``groups`` names
    process groups by their registered name (``{group_name: "cp"}``), looked up first: two
    groups of the same ranks (context parallel's ``cp`` and FSDP's dp x cp when dp = 1)
    are told apart so.
    """

    def __init__(self, dims: dict[str, tuple[int, ...]] | None = None,
                 groups: dict[str, str] | None = None) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.payload: dict[str, int] = defaultdict(int)
        self.sent: dict[str, float] = defaultdict(float)
        self.by_dim: dict[str, dict[str, dict[str, float]]] = {}
        self._dims: dict[tuple[int, ...], list[str]] = defaultdict(list)
        for name, r in (dims or {}).items():
            self._dims[tuple(r)].append(name)
        self._groups = dict(groups or {})
        self._original: Any = None

    def _record(self, kind: str, payload: int, sent: float, where: str) -> None:
        self.calls[kind] += 1
        self.payload[kind] += payload
        self.sent[kind] += sent
        row = self.by_dim.setdefault(_LABEL.get() or where, {}).setdefault(
            kind, {"calls": 0, "payload_bytes": 0, "sent_bytes": 0.0})
        row["calls"] += 1
        row["payload_bytes"] += payload
        row["sent_bytes"] += sent

    def __enter__(self) -> CommMeter:
        self._original = c10d.isend

        def counting_isend(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            n = _nbytes(tensor)
            self._record("send", n, float(n), "pp")
            return self._original(tensor, *args, **kwargs)

        # Both names: torch.distributed re-exports isend, and P2POp checks against c10d's.
        dist.isend = c10d.isend = counting_isend
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        dist.isend = c10d.isend = self._original

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(t is DTensor or _wrapper(t) for t in types):
            # Modes run before tensor subclasses: step aside so DTensor desugars the op
            # first, and its own collectives (e.g. loss_parallel's all-reduces inside
            # log_softmax) come back through this mode (as CommDebugMode does); so too a
            # wrapper subclass, whose collective then comes back on its inner data
            # (torchao's Float8TrainingTensor gathers its 1-byte payload, not the bf16 its
            # dtype names).
            return NotImplemented
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        namespace = getattr(func, "namespace", "")
        if namespace in ("_c10d_functional", "c10d") and name in _OPS:
            kind, arg, _ = _OPS[name]
            payload = _nbytes(args[arg]) if len(args) > arg else 0
            group = _group(args, kwargs)
            sent = _alltoall_sent(name, args, group, payload) if kind == "all_to_all" else None
            if sent is None:
                sent = ring_bytes(kind, payload, _group_size(group))
            self._record(kind, payload, sent, self._where(kind, _group_ranks(group), group))
        return func(*args, **kwargs)

    def _where(self, kind: str, ranks: tuple[int, ...], group: Any = None) -> str:
        name = getattr(group, "group_name", None) if self._groups else None
        if name in self._groups:
            return self._groups[name]
        names = self._dims.get(ranks) or ["other"]
        if len(names) > 1 and "ep" in names:
            return "ep" if kind == "all_to_all" else next(n for n in names if n != "ep")
        return names[0]

    def summary(self) -> dict[str, Any]:
        """Per kind: calls, payload bytes, bytes sent (ring); and ``by_dim``, the same per
        mesh dimension or label."""
        out: dict[str, Any] = {k: {"calls": self.calls[k], "payload_bytes": self.payload[k],
                                   "sent_bytes": self.sent[k]} for k in sorted(self.calls)}
        out["by_dim"] = {d: dict(sorted(v.items())) for d, v in sorted(self.by_dim.items())}
        return out


class FlopMeter(TorchDispatchMode):
    """Count the FLOPs of the matmuls and attention kernels this rank runs, at the shapes it
    runs them (a DTensor op is counted through the local ops it desugars to).

    It uses torch's own formulas (``torch.utils.flop_counter.flop_registry``) but, unlike
    ``FlopCounterMode``, never decomposes an operator it has no formula for: a decomposed
    operator computes with other kernels, so a measured step would no longer be bitwise
    the step an unmeasured run takes (and a resumed run would drift from an uninterrupted
    one). torch 2.13's registry has formulas for the CUDA SDPA kernels only, so the CPU
    fused attention (``_scaled_dot_product_flash_attention_for_cpu`` and its backward) is
    mapped to the same formulas (full s x s, as the cost model counts it by default).
    """

    def __init__(self) -> None:
        super().__init__()

        def forward(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None,
                    **kw: Any) -> int:
            return sdpa_flop_count(q, k, v)

        def backward(g: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None,
                     **kw: Any) -> int:
            return sdpa_backward_flop_count(g, q, k, v)

        aten = torch.ops.aten
        self.registry = dict(flop_registry)
        if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
            self.registry[aten._scaled_dot_product_flash_attention_for_cpu] = \
                shape_wrapper(forward)
            self.registry[aten._scaled_dot_product_flash_attention_for_cpu_backward] = \
                shape_wrapper(backward)
        self.counts: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(t is DTensor for t in types):  # count the local ops DTensor runs instead
            return NotImplemented
        out = func(*args, **kwargs)
        packet = getattr(func, "_overloadpacket", None)
        if packet in self.registry:
            self.counts[str(packet)] += int(self.registry[packet](*args, **kwargs,
                                                                  out_val=out))
        return out

    def get_flop_counts(self) -> dict[str, dict[str, int]]:
        """FLOPs by operator, in ``FlopCounterMode``'s shape (``{"Global": {op: n}}``)."""
        return {"Global": dict(self.counts)}


def flop_counter() -> FlopMeter:
    """A :class:`FlopMeter` (what ``train`` wraps its measured step in)."""
    return FlopMeter()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _held_bytes(tensors: list[torch.Tensor], seen: set[tuple[int, int, int, str]]) -> int:
    total = 0
    for t in tensors:
        loc = _local(t)
        # The storage's identity (its C++ StorageImpl), not its data pointer: a fake
        # tensor (dry run) has none, and every one would look like the same storage. A
        # wrapper (torchao's fp8-gathered weight) by its inner tensor's: a fake wrapper's
        # own is shared by all of them.
        key = (data_tensors(loc)[0].untyped_storage()._cdata, loc.storage_offset(),
               loc.numel(), str(loc.dtype))
        if loc.numel() == 0 or key in seen:
            continue
        seen.add(key)
        total += loc.numel() * loc.element_size()
    return total


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None
                ) -> dict[str, int]:
    """Bytes this rank holds: parameters, gradients, optimizer state, and their total.

    DTensors count their local shard (``to_local()``: elements held, so FSDP2's padding
    of an uneven last shard is not counted); a tensor reached twice (a tied weight, a
    shared storage) counts once. ``optimizer`` counts every non-scalar state
    tensor (AdamW's ``exp_avg`` and ``exp_avg_sq``); the 0-dim ``step`` counters are left
    out so the figure compares with the estimator's ``2 x params`` of Adam moments.
    """
    seen: set[tuple[int, int, int, str]] = set()
    params = list(model.parameters())
    out = {"params": _held_bytes(params, seen)}
    out["grads"] = _held_bytes([p.grad for p in params if p.grad is not None], seen)
    states: list[torch.Tensor] = []
    if optimizer is not None:
        for state in optimizer.state.values():
            states += [v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    out["optimizer"] = _held_bytes(states, seen)
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out
