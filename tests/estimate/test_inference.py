"""Inference: KV cache sizes, decode and prefill rooflines, the largest batch."""

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.hardware import ACCELERATORS
from shardlab.estimate.inference import (
    decode_step,
    kv_bytes_per_token,
    max_decode_batch,
    prefill_step,
    weights_read_per_step,
)
from shardlab.estimate.params import count_params

H100 = ACCELERATORS["H100 SXM"]


@pytest.mark.parametrize(("name", "kib"), [
    ("llama-3-8b", 128),       # 2 * 32 layers * 8 kv heads * 128 * 2 B
    ("llama-2-7b", 512),       # no GQA: 32 kv heads
    ("llama-3-70b", 320),      # 80 layers * 8 kv heads
    ("gpt3-175b", 4608),       # 96 layers * 12288 * 2 * 2 B
])
def test_kv_bytes_per_token(name: str, kib: int) -> None:
    assert kv_bytes_per_token(get_model(name), 2) == kib * 1024


def test_decode_is_memory_bound_at_batch_one_and_compute_bound_when_huge() -> None:
    m = get_model("llama-3-8b")
    one = decode_step(m, H100, 1, 1024)
    assert one.roofline.bound == "memory"
    weights = count_params(m).total * 2
    assert one.roofline.t_memory == (weights + 131072 * 1024) / H100.memory_bandwidth
    assert decode_step(m, H100, 4096, 16).roofline.bound == "compute"


def test_prefill_is_compute_bound() -> None:
    assert prefill_step(get_model("llama-3-8b"), H100, 1, 4096).roofline.bound == "compute"


def test_max_batch() -> None:
    m = get_model("llama-3-8b")
    n = max_decode_batch(m, H100, 8192)
    free = 80e9 - count_params(m).total * 2
    assert n == int(free // (131072 * 8192))
    assert max_decode_batch(get_model("gpt3-175b"), H100, 2048) == 0


def test_moe_reads_only_touched_experts() -> None:
    m = get_model("mixtral-8x7b")
    total = count_params(m).total
    assert weights_read_per_step(m, 1) < weights_read_per_step(m, 4) < total
    assert weights_read_per_step(m, 10_000) == pytest.approx(total, rel=1e-9)
    # One token: 2 of 8 experts per layer.
    expert = 3 * 4096 * 14336
    assert weights_read_per_step(m, 1) == pytest.approx(total - 32 * 6 * expert, rel=1e-12)
