"""The memory guard: the cost model's peak per process against the host's free memory."""

from __future__ import annotations

import pytest

from shardlab.cli import guard
from shardlab.config import host
from shardlab.errors import SpecError


def test_refuses_what_does_not_fit_and_names_the_figures(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(guard, "available_memory_bytes", lambda: (10e9, "test"))
    guard.check_host_memory(4e9, 2, "job")  # 8 GB of 10: fits within 90%
    with pytest.raises(SpecError) as info:
        guard.check_host_memory(5e9, 2, "shardlab train x")
    text = str(info.value)
    assert "10.00 GB" in text and "5.00 GB" in text and "x 2" in text
    assert "--allow-oversubscribe" in text
    guard.check_host_memory(5e9, 2, "job", allow_oversubscribe=True)
    monkeypatch.setattr(guard, "available_memory_bytes", lambda: (0.0, ""))
    guard.check_host_memory(1e15, 8, "job")  # unknown: not refused


def test_available_memory_is_read_from_this_host() -> None:
    available, source = host.available_memory_bytes()
    assert available > 0 and source
    total, _ = host.memory_bytes()
    assert available <= total


def test_on_gpus_each_rank_is_held_against_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "device_free_bytes", lambda: (80e9, "a GPU"))
    monkeypatch.setattr(guard, "available_memory_bytes", lambda: (1e9, "host"))
    guard.check_memory(70e9, 8, "job", on_gpus=True)  # per rank on its own device: fits
    with pytest.raises(SpecError, match=r"per rank .* 80.00 GB \(74.51 GiB\) free on each GPU"):
        guard.check_memory(75e9, 8, "job", on_gpus=True)
    guard.check_memory(75e9, 8, "job", allow_oversubscribe=True, on_gpus=True)
    with pytest.raises(SpecError, match="this host has available"):
        guard.check_memory(2e9, 1, "job", on_gpus=False)  # the CPU: the host's memory
