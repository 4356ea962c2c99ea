"""The memory guard of the commands that start real processes (``train``, ``verify``,
``simulate``): the cost model's peak per process against what this host has free (or, on a
machine with NVIDIA GPUs, what each rank's device has free), checked before anything
starts, so a layout too big for the machine is refused with its figures instead of growing
until the kernel kills a rank or CUDA runs out of memory."""

from __future__ import annotations

from pathlib import Path

from shardlab.config.host import available_memory_bytes
from shardlab.errors import SpecError
from shardlab.units import human_bytes

HEADROOM = 0.9
"""Share of the available memory a job may plan to take: the interpreter, torch's own
allocations and the page cache need the rest."""


def check_host_memory(per_process: float, processes: int, what: str,
                      allow_oversubscribe: bool = False) -> None:
    """Refuse (SpecError, so exit 2) when ``processes`` x ``per_process`` bytes, the cost
    model's peak of each process, exceed :data:`HEADROOM` of this host's available memory
    (:func:`~shardlab.config.host.available_memory_bytes`). ``what`` names the job in
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


NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")
"""Present where an NVIDIA driver is loaded: how the guard knows, without importing torch,
that the ranks will run on GPUs."""


def device_free_bytes() -> tuple[float, str]:
    """Free memory of GPU 0 (bytes) and where the figure came from, or (0, "") without
    CUDA. Each rank gets a GPU of its own; the devices of one machine are alike."""
    # Imported here: only on a machine with an NVIDIA driver, where the ranks load torch.
    import torch

    if not torch.cuda.is_available():
        return 0.0, ""
    free, _ = torch.cuda.mem_get_info(0)
    return float(free), f"torch.cuda.mem_get_info on {torch.cuda.get_device_name(0)}"


def check_memory(per_process: float, processes: int, what: str,
                 allow_oversubscribe: bool = False, on_gpus: bool | None = None) -> None:
    """The guard for ranks: on GPUs (``on_gpus``, default: an NVIDIA driver is loaded)
    each rank's peak against :data:`HEADROOM` of its device's free memory; on the CPU,
    :func:`check_host_memory` for all of them."""
    if on_gpus is None:
        on_gpus = NVIDIA_DRIVER.exists()
    if not on_gpus:
        check_host_memory(per_process, processes, what, allow_oversubscribe)
        return
    if allow_oversubscribe:
        return
    free, source = device_free_bytes()
    if free <= 0 or per_process <= HEADROOM * free:
        return
    raise SpecError("memory", human_bytes(per_process),
                    f"{what} needs about {human_bytes(per_process)} per rank (the cost "
                    f"model's peak), more than {HEADROOM:.0%} of the {human_bytes(free)} free "
                    f"on each GPU ({source}); use more GPUs or a layout that shards more, or "
                    "--allow-oversubscribe to start anyway")
