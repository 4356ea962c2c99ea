"""The memory guard of the commands that start real processes (``train``, ``verify``,
``simulate``): the cost model's peak per process against what this host has free, checked
before anything starts, so a layout too big for the machine is refused with its figures
instead of growing until the kernel kills a rank."""

from __future__ import annotations

from shardlab.calibrate.host import available_memory_bytes
from shardlab.errors import SpecError
from shardlab.units import human_bytes

HEADROOM = 0.9
"""Share of the available memory a job may plan to take: the interpreter, torch's own
allocations and the page cache need the rest."""


def check_host_memory(per_process: float, processes: int, what: str,
                      allow_oversubscribe: bool = False) -> None:
    """Refuse (SpecError, so exit 2) when ``processes`` x ``per_process`` bytes, the cost
    model's peak of each process, exceed :data:`HEADROOM` of this host's available memory
    (:func:`~shardlab.calibrate.host.available_memory_bytes`). ``what`` names the job in
    the message. Nothing is checked with ``allow_oversubscribe`` or when the available
    memory cannot be read."""
    if allow_oversubscribe:
        return
    available, source = available_memory_bytes()
    need = per_process * processes
    if available <= 0 or need <= HEADROOM * available:
        return
    raise SpecError("memory", human_bytes(need),
                    f"{what} needs about {human_bytes(per_process)} per process x "
                    f"{processes} (the cost model's peak), more than {HEADROOM:.0%} of the "
                    f"{human_bytes(available)} this host has available ({source}); use a "
                    "smaller model or layout, or --allow-oversubscribe to start anyway")
