"""The measured runtime of this machine as the planner reads it: gloo's rate per collective
and the runtime's fixed costs per parallel style, fitted from real ranks by
:mod:`shardlab.calibrate.runtime` and stored in ``cpu.json``'s ``runtime`` section. No
torch, no numpy here."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass
from typing import Any

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send")
"""The collectives timed; the names :class:`Runtime.collectives` is keyed by."""

STYLES = ("ddp", "fsdp", "tp", "pp")
"""Parallel styles whose fixed costs are measured (see the module docstring)."""

@dataclass(frozen=True)
class Overhead:
    """Seconds a step costs beyond its arithmetic, for L layers on the rank and m
    micro-batches: per_step + L·per_layer_step + m·(per_microbatch + L·per_layer).

    ``per_layer_step`` is what a layer costs once a step (its parameters' optimizer and
    clipping work, FSDP's one gradient reduce-scatter under accumulation);
    ``per_layer`` what it costs in every micro-batch (forward and backward dispatch,
    hooks, FSDP's gathers, tensor parallel's collectives)."""

    per_step: float
    per_layer_step: float
    per_microbatch: float
    per_layer: float

    def seconds(self, microbatches: Any, layers: Any) -> Any:
        """The overhead of a step (numpy arrays broadcast)."""
        return (self.per_step + layers * self.per_layer_step
                + microbatches * (self.per_microbatch + layers * self.per_layer))

@dataclass(frozen=True)
class Runtime:
    """The measured runtime of this machine: ``collectives`` name -> (latency s, bandwidth
    bytes/s), ``overheads`` style -> :class:`Overhead`, at ``world`` one-thread ranks."""

    world: int
    collectives: dict[str, tuple[float, float]]
    overheads: dict[str, Overhead]

def parse_runtime(doc: Any) -> Runtime | None:
    """The stored ``runtime`` section as a :class:`Runtime`, or None when absent or unusable
    (an older file: the planner then prices this machine without it)."""
    try:
        world = int(doc["world"])
        collectives = {name: (float(doc["collectives"][name]["latency"]),
                              float(doc["collectives"][name]["bandwidth"]))
                       for name in COLLECTIVES}
        overheads = {style: Overhead(*(float(doc["overheads"][style][k]) for k in (
            "per_step", "per_layer_step", "per_microbatch", "per_layer"))) for style in STYLES}
    except (KeyError, TypeError, ValueError):
        return None
    values = [v for c in collectives.values() for v in c] + [
        v for o in overheads.values() for v in astuple(o)]
    if world < 2 or any(not math.isfinite(v) or v < 0 for v in values) or any(
            b <= 0 for _, b in collectives.values()):
        return None
    return Runtime(world, collectives, overheads)
