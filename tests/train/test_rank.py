"""How a rank runs bf16: autocast on the rank's own device type (an autocast for "cpu"
does nothing to a CUDA rank's matmuls), or FSDP2's bf16 parameter copies."""

from __future__ import annotations

import contextlib
import warnings

import torch

from shardlab.config.model import ModelShape
from shardlab.nn.garden import garden_vocab
from shardlab.train.config import TrainConfig, fsdp_mixed_precision
from shardlab.train.rank import bf16_autocast

TINY = ModelShape("tiny", 2, 32, 4, garden_vocab().size, 16, style="llama", tied=False)


def test_bf16_autocast_follows_the_ranks_device_type() -> None:
    cfg = TrainConfig(shape=TINY, dtype="bf16")
    on_cpu = bf16_autocast(cfg, "cpu")
    assert isinstance(on_cpu, torch.autocast)
    assert (on_cpu.device, on_cpu.fast_dtype) == ("cpu", torch.bfloat16)
    with warnings.catch_warnings():  # on a machine without CUDA it warns and disables itself
        warnings.simplefilter("ignore")
        on_gpu = bf16_autocast(cfg, "cuda")
    assert (on_gpu.device, on_gpu.fast_dtype) == ("cuda", torch.bfloat16)
    # Under the CPU autocast a CPU matmul runs in bf16; fp32 runs get no autocast at all.
    with bf16_autocast(cfg, "cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert isinstance(bf16_autocast(TrainConfig(shape=TINY), "cpu"), contextlib.nullcontext)


def test_fsdp_takes_bf16_through_its_parameter_copies_not_autocast() -> None:
    assert fsdp_mixed_precision(TrainConfig(shape=TINY, dtype="bf16", dp=2))
    assert not fsdp_mixed_precision(TrainConfig(shape=TINY, dtype="bf16", dp=2, dp_mode="ddp"))
    assert not fsdp_mixed_precision(TrainConfig(shape=TINY, dtype="fp32", dp=2))
