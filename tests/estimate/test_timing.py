"""Training time from FLOPs and MFU; the seed's 100B question."""

import pytest
from torch.testing import assert_close

from shardlab.errors import SpecError
from shardlab.estimate.timing import train_time


def test_days_cost_energy() -> None:
    t = train_time(1e24, 1000, 1e15, 0.5, price_per_gpu_hour=2.0, power_watts=700)
    assert_close(t.seconds, 1e24 / (1000 * 1e15 * 0.5), rtol=1e-12, atol=0)
    assert_close(t.days, t.seconds / 86400, rtol=1e-12, atol=0)
    assert_close(t.gpu_hours, t.seconds / 3600 * 1000, rtol=1e-12, atol=0)
    assert_close(t.cost, 2 * t.gpu_hours, rtol=1e-12, atol=0)
    assert_close(t.energy_kwh, 0.7 * t.gpu_hours, rtol=1e-12, atol=0)


@pytest.mark.parametrize("mfu", [0, -0.1, 1.01])
def test_mfu_outside_unit_interval(mfu: float) -> None:
    with pytest.raises(SpecError, match="mfu"):
        train_time(1e20, 8, 1e15, mfu, 1.0, 700)
