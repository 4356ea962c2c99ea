"""Fixtures the command tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardlab.calibrate.store import save_measurement
from shardlab.config.measured import SCHEMA


@pytest.fixture
def cpu_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stored measurement of a made-up CPU: `plan --gpu cpu` without timing anything."""
    monkeypatch.setenv("SHARDLAB_HOME", str(tmp_path))
    save_measurement({"schema": SCHEMA, "name": "cpu (measured)",
                      "peak_flops": {"fp32": 1e11, "bf16": 5e10}, "memory_bytes": 8e9,
                      "memory_bandwidth": 2e10, "copy_bandwidth": 1e10, "power_watts": 0,
                      "threads": 2})
    return tmp_path
