"""The torch internals a dry run stands on, pinned: a torch upgrade that moves one fails
here, by name, rather than somewhere inside a dry run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._utils import InferenceMode
from torch.distributed.pipelining.schedules import _PipelineSchedule

from shardlab.dryrun.fake import (
    RealTensorError,
    check_all_fake,
    fake_mode,
    fp8_weight_flatten,
    is_fake,
    materialize,
    skip_pipeline_vote,
    strict,
)
from shardlab.dryrun.tracker import FOLD, fold


def test_the_internals_a_dry_run_uses_are_where_it_expects_them() -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert issubclass(FakeStore, dist.Store) and dist.Backend.FAKE == "fake"
    assert callable(_PipelineSchedule._warmup_p2p)  # replaced by skip_pipeline_vote
    for name in ("_update_peak_stats", "_fsdp_state_pre_forward", "track_inputs"):
        assert callable(getattr(FSDPMemTracker, name)), name
    for name in ("_update_peak_stats", "_pre_fw_hook", "track_external"):
        assert callable(getattr(MemTracker, name)), name
    tracker = MemTracker()  # the attributes the role tracker reads
    for name in ("_curr_mem_snap", "_peak_mem", "_mod_tracker", "_in_opt"):
        assert hasattr(tracker, name), name
    assert tracker._mod_tracker.parents == {"Global"}


def test_every_reference_type_of_torchs_trackers_has_a_category() -> None:
    for kind in [*_FSDPRefType, *_MemRefType]:
        assert kind.value in FOLD, kind
    snap = {_FSDPRefType.SHARDED_PARAM: 10, _FSDPRefType.UNSHARDED_PARAM: 3,
            _FSDPRefType.OPT: 20, _FSDPRefType.ACT: 7, _FSDPRefType.INP: 1, "Total": 41}
    assert fold(snap) == {"params": 10, "grads": 0, "optimizer": 20, "activations": 8,
                          "temporaries": 3}


def test_materialised_modules_hold_no_real_tensor() -> None:
    with torch.device("meta"):
        layer = nn.Linear(1 << 14, 1 << 14)  # 1 GiB of fp32 weights, never allocated
    mode = fake_mode()
    materialize(mode, [layer])
    check_all_fake([layer])
    assert is_fake(layer.weight) and layer.weight.shape == (1 << 14, 1 << 14)
    with pytest.raises(RealTensorError, match="weight is a real tensor of 64 bytes"):
        check_all_fake([nn.Linear(4, 4, bias=False)])


def test_a_real_tensor_in_the_step_is_refused_by_name() -> None:
    mode = fake_mode()
    real = torch.ones(3)
    with pytest.raises(RealTensorError, match="FakeTensor"), strict(mode):
        torch.ones(3) + real
    assert mode.allow_non_fake_inputs  # the mode accepts meta inputs again afterwards


def test_the_pipeline_vote_is_set_to_static() -> None:
    class Stage:
        _inference_mode = None

    class Schedule:
        pass

    schedule, stages = Schedule(), [Stage(), Stage()]
    skip_pipeline_vote(schedule)
    schedule._warmup_p2p(stages, True, False)
    assert [s._inference_mode for s in stages] == [InferenceMode.STATIC] * 2
    assert "_inference_mode" in PipelineStage.__init__.__code__.co_names


@pytest.mark.multiprocess
def test_dtensor_propagation_is_not_counted_as_the_dry_runs_memory() -> None:
    """A loss-parallel loss's forward on tp 2 (bf16 logits [1024, 65536] split over the
    vocabulary): torch's trackers see 14 B per local logit, what eager holds (the bf16
    logits, their fp32 copy, ``shifted``, ``exp(shifted)``), once DTensor's sharding
    propagation runs in a fake mode of its own; under the dry run's mode its global-shape
    tensors added 8 B (22)."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.distributed.tensor.parallel import loss_parallel

    from shardlab.dryrun.fake import fake_world, propagation_apart

    tokens, vocab, width = 1024, 65536, 64
    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def forward_peak(apart: bool) -> float:
        mode = fake_mode()
        with fake_world(0, 2):
            mesh = init_device_mesh("cpu", (2,))
            with mode:
                head = torch.randn(vocab // 2, width, dtype=torch.bfloat16)
                hidden = torch.randn(1, tokens, width, dtype=torch.bfloat16,
                                     requires_grad=True)
                labels = torch.randint(0, vocab, (tokens,))
            weight = DTensor.from_local(head, mesh, [Shard(0)]).requires_grad_(True)
            tracker = MemTracker()
            tracker.track_external(hidden, weight)
            inner = contextlib.nullcontext() if apart else _propagate_in(original)
            with inner, mode, tracker, loss_parallel():
                logits = torch.matmul(DTensor.from_local(hidden, mesh, [Replicate()]),
                                      weight.t())
                F.cross_entropy(logits.float().flatten(0, 1), labels, reduction="sum")
                peak = tracker.get_tracker_snapshot("peak")
        snap = next(iter(peak.values()))
        return snap[_MemRefType.ACT] / (tokens * vocab / 2)

    assert forward_peak(apart=True) == pytest.approx(14.0, abs=0.01)
    assert forward_peak(apart=False) == pytest.approx(22.0, abs=0.01)
    # Restored on the way out of the fake world.
    assert ShardingPropagator._propagate_tensor_meta_non_cached is original
    with propagation_apart():
        assert ShardingPropagator._propagate_tensor_meta_non_cached is not original


@contextlib.contextmanager
def _propagate_in(original: object) -> Iterator[None]:
    """Inside fake_world: torch's own propagation, under whatever fake mode is active."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]
    yield


def test_torchaos_fp8_weight_flattens_without_reading_a_fake_scale() -> None:
    """torchao 0.18's fp8-gathered weight tests its fake scale's truth value when flattened
    (a data read, refused); inside ``fp8_weight_flatten`` it lists the weight and the scale
    without reading either, and its wrapper counts as fake when its inner tensors are."""
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torchao.float8.float8_training_tensor import LinearMMConfig
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    with fake_mode():
        inner, scale = torch.empty(16, 16), torch.empty(())
    weight = WeightWithDynamicFloat8CastTensor(inner, LinearMMConfig(), torch.float8_e4m3fn,
                                               scale)
    with pytest.raises(DataDependentOutputException):
        weight.__tensor_flatten__()
    with fp8_weight_flatten():
        names, spec = weight.__tensor_flatten__()
        assert is_fake(weight) and not is_fake(torch.zeros(1))
    assert names == ["_tensor", "_precomputed_scale"] and spec["dtype"] == torch.float8_e4m3fn
