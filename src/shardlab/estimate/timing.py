"""Training time, money and energy from total FLOPs and an assumed MFU.

Time = FLOPs / (devices x peak FLOP/s x MFU) (the seed calculator; Narayanan et
al. 2021's 8·T·P/(n·X) is the same with full recompute folded in). MFU, model
FLOPs utilisation, is the fraction of the dense peak that the *model* FLOPs
achieve (PaLM, Chowdhery et al. 2022); 0.3-0.5 is typical of large runs. Money is
device-hours x an assumed price; energy is device-hours x board power, an upper
bound that leaves out the host, network and cooling.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import SpecError


@dataclass(frozen=True)
class TrainTime:
    """Wall time, device-hours, cost and energy of a training run."""

    seconds: float
    days: float
    gpu_hours: float
    cost: float
    energy_kwh: float


def train_time(flops: float, gpus: int, peak: float, mfu: float, price_per_gpu_hour: float,
               power_watts: float) -> TrainTime:
    """Run time of ``flops`` model FLOPs on ``gpus`` devices of ``peak`` FLOP/s at ``mfu``."""
    if not 0 < mfu <= 1:
        raise SpecError("mfu", mfu, "must be in (0, 1]")
    seconds = flops / (gpus * peak * mfu)
    hours = seconds / 3600 * gpus
    return TrainTime(seconds, seconds / 86400, hours, hours * price_per_gpu_hour,
                     hours * power_watts / 1000)
