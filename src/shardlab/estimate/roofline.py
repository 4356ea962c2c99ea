"""The roofline model: an operation takes at least max(FLOPs / peak, bytes / bandwidth).

Williams, Waterman & Patterson 2009. Arithmetic intensity FLOPs/byte above the
ridge point peak/bandwidth means compute-bound, below means memory-bound. Fixed
costs (kernel launch, communication) are left out, so real times are longer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    """Lower bound of one operation's time, and which roof bounds it."""

    flops: float
    bytes: float
    t_compute: float
    t_memory: float

    @property
    def seconds(self) -> float:
        """max(t_compute, t_memory)."""
        return max(self.t_compute, self.t_memory)

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: whichever roof is lower for this operation."""
        return "compute" if self.t_compute >= self.t_memory else "memory"

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else float("inf")


def roofline(flops: float, nbytes: float, peak: float, bandwidth: float) -> Roofline:
    """Roofline of ``flops`` FLOPs over ``nbytes`` bytes on a device of ``peak`` FLOP/s and
    ``bandwidth`` bytes/s."""
    return Roofline(flops, nbytes, flops / peak, nbytes / bandwidth)
