"""The memory guard: the cost model's peak per process against the host's free memory."""

from __future__ import annotations

import pytest

from shardlab.calibrate import host
from shardlab.cli import guard
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
