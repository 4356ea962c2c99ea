"""The fake world a dry run runs in: one process acting as rank R of an N-rank job.

These pieces of torch (and one of torchao) do the work, and this module is the one place
that names them, so an upgrade that moves them breaks here, in ``tests/dryrun/test_fake.py``:

* **torch's fake process group** (``init_process_group("fake", store=FakeStore())``;
  the backend is registered by ``torch.testing._internal.distributed.fake_pg``). Every
  collective returns at once without moving data, so this process can build the device
  mesh of any world size and run the sharded program of any rank.
* **FakeTensorMode** (``torch._subclasses.fake_tensor``): tensors with shapes, dtypes
  and storage sizes but no data. The model is built and laid out on the meta device
  (``fully_shard`` on tensor-parallel DTensors under FakeTensorMode fails on
  ``aten.nonzero``, as probed on torch 2.13), then materialised with ``to_empty`` under
  the mode (:func:`materialize`).
* **the pipeline's warm-up vote** (``_PipelineSchedule._warmup_p2p``): before its first
  step a torch.distributed.pipelining schedule exchanges one integer per stage to agree
  on static or dynamic shapes, and reads it (``.item()``), which a fake tensor cannot
  give and a fake group never delivers. Every stage shardlab builds has static shapes
  (:func:`shardlab.distributed.pipeline.stage_io_meta`), so the vote's outcome is
  known: :func:`skip_pipeline_vote` sets it.
* **DTensor's sharding propagation** (``ShardingPropagator.
  _propagate_tensor_meta_non_cached``): to learn an operator's output shape it runs the
  operator on fake tensors of the *global* shapes. In an eager run on a GPU that happens
  in a FakeTensorMode of its own (nothing allocated), and torch's memory trackers skip
  operators under a fake mode other than the one they were entered in. Under the dry
  run's mode torch propagates without its cache and reuses the active fake mode
  (``detect_fake_mode()``), so the trackers counted those global-shape tensors as
  memory: 8 B per local logit at the forward peak of a loss-parallel loss on tp 2
  (22 B where eager holds 14). :func:`fake_world` runs propagation in a mode of its own,
  as eager does.

* **torchao's fp8-gathered weight** (``WeightWithDynamicFloat8CastTensor``, under
  ``--fp8-all-gather``): torchao 0.18's ``__tensor_flatten__`` asks whether the weight has
  a precomputed scale with ``if self._precomputed_scale:``, the scale tensor's truth
  value, which reads its data (``aten._local_scalar_dense``) where a fake scale has none;
  torchao's other float8 wrappers ask ``is not None``. torch's FSDP memory tracker
  flattens every parameter, so the dry run runs with the ``is not None`` question
  (:func:`fp8_weight_flatten`); the real run's answer is the same, its scales being
  nonzero.

A real tensor inside the measured step would be real memory: while a step runs, the
mode refuses non-fake inputs (:func:`strict`), and :class:`RealTensorError` says which
operator met one, instead of an out-of-memory far into the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.pipelining._utils import InferenceMode
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardlab.distributed.inner import data_tensors


class RealTensorError(RuntimeError):
    """A real (non-fake) tensor reached an operator during the dry run."""


@contextlib.contextmanager
def fake_world(rank: int, world: int) -> Iterator[None]:
    """The default process group as torch's fake backend, this process as ``rank`` of
    ``world``; destroyed on the way out (so a process can dry-run several roles)."""
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        with propagation_apart():
            yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def propagation_apart() -> Iterator[None]:
    """DTensor's sharding propagation in a FakeTensorMode of its own while inside (module
    docstring): what it builds is not the dry run's memory, as it is not an eager run's."""
    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def apart(self: ShardingPropagator, op_schema: Any) -> Any:
        with FakeTensorMode():
            return original(self, op_schema)

    ShardingPropagator._propagate_tensor_meta_non_cached = apart  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = (  # type: ignore[method-assign]
            original)


def fake_mode() -> FakeTensorMode:
    """A FakeTensorMode that accepts the meta parameters ``to_empty`` starts from."""
    return FakeTensorMode(allow_non_fake_inputs=True)


def materialize(mode: FakeTensorMode, modules: list[Any]) -> None:
    """``to_empty`` every module under ``mode``: parameters and buffers become fake CPU
    tensors (FSDP2 re-points its sharded parameters at them), no byte allocated.

    Post-accumulate-grad hooks are registered again afterwards: ``to_empty`` swaps each
    DTensor parameter's tensor (``torch.utils.swap_tensors``), which carries the Python
    dict of hooks to the new tensor but leaves their registration with autograd behind, so
    they would never run (tensor parallelism's hook that brings a gradient to its
    parameter's placements: without it the vocab-sharded embedding's gradient stayed the
    whole ``[V, d]``, as a meta-built real run showed too).
    """
    with mode:
        for module in modules:
            module.to_empty(device="cpu")
    for module in modules:
        for param in module.parameters():
            hooks = param._post_accumulate_grad_hooks
            if hooks:
                param._post_accumulate_grad_hooks = None
                for hook in list(hooks.values()):
                    param.register_post_accumulate_grad_hook(hook)


def is_fake(t: torch.Tensor) -> bool:
    """Whether ``t`` (or a DTensor's local shard) holds no real data. A wrapper subclass
    (torchao's fp8-gathered weight, ``WeightWithDynamicFloat8CastTensor``) holds its data
    in inner tensors: it is fake when every one of them is."""
    return all(isinstance(x, FakeTensor) or x.device.type == "meta" for x in data_tensors(t))


def check_all_fake(modules: list[Any]) -> None:
    """RealTensorError when a parameter or buffer of ``modules`` is a real tensor."""
    for module in modules:
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if not is_fake(t):
                raise RealTensorError(f"{name} is a real tensor of "
                                      f"{t.numel() * t.element_size():,} bytes after "
                                      "materialisation")


@contextlib.contextmanager
def strict(mode: FakeTensorMode) -> Iterator[FakeTensorMode]:
    """Run inside ``mode`` with real inputs refused: a real tensor would be real memory.
    torch raises an AssertionError naming the operator; it comes out as RealTensorError."""
    mode.allow_non_fake_inputs = False
    try:
        with mode:
            yield mode
    except AssertionError as e:
        if "FakeTensor" not in str(e):
            raise
        raise RealTensorError(str(e).splitlines()[0]) from None
    finally:
        mode.allow_non_fake_inputs = True


@contextlib.contextmanager
def fp8_weight_flatten() -> Iterator[None]:
    """Inside: torchao's ``WeightWithDynamicFloat8CastTensor.__tensor_flatten__`` lists its
    precomputed scale when it has one (``is not None``), without reading the scale's value
    (module docstring). Imports torchao: call it for an fp8-gathering run only."""
    # Imported here: torchao is needed (and installed) for fp8 runs only.
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor as Weight

    original = Weight.__tensor_flatten__

    def flatten(self: Any) -> tuple[list[str], dict[str, Any]]:
        inner, spec = original(_NoScale(self))
        return inner + (["_precomputed_scale"] if self._precomputed_scale is not None
                        else []), spec

    Weight.__tensor_flatten__ = flatten  # type: ignore[method-assign]
    try:
        yield
    finally:
        Weight.__tensor_flatten__ = original  # type: ignore[method-assign]


class _NoScale:
    """A view of a torchao weight wrapper whose precomputed scale reads as absent, so its
    own ``__tensor_flatten__`` lists the inner tensor and the spec, no scale."""

    _precomputed_scale = None

    def __init__(self, weight: Any) -> None:
        self._weight = weight

    def __getattr__(self, name: str) -> Any:
        return getattr(self._weight, name)


def skip_pipeline_vote(schedule: Any) -> None:
    """Replace ``schedule``'s warm-up vote by its known outcome: every stage static.

    The vote (``_PipelineSchedule._warmup_p2p``) sends one integer down the pipeline and
    back and reads it; on a fake group nothing arrives. shardlab's stages are all built
    with full input and output metadata, and no stage passes DTensors, so every stage
    votes static: the same mode the real run's vote reaches.
    """
    def static(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    schedule._warmup_p2p = static
