"""What the operating system says about this machine: its memory (bytes) and its CPU's
model name, stored beside the measured figures (never its host name)."""

from __future__ import annotations

import math
import os
from pathlib import Path


def _meminfo(key: str) -> tuple[float, str]:
    """``key``'s figure of ``/proc/meminfo`` in bytes (it is given in KiB) and its source, or
    (0, "") where there is no such file or line."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith(f"{key}:"):
                    return float(line.split()[1]) * 1024, f"/proc/meminfo {key}"
    except (OSError, ValueError, IndexError):
        pass
    return 0.0, ""


def memory_bytes() -> tuple[float, str]:
    """Physical memory (bytes) and where the figure came from."""
    total, source = _meminfo("MemTotal")
    if total <= 0:
        try:
            total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
            source = "os.sysconf(SC_PAGE_SIZE x SC_PHYS_PAGES)"
        except (OSError, ValueError, AttributeError):
            total, source = 0.0, ""
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text(encoding="ascii").strip()
        limit = float(text) if text != "max" else math.inf
        if 0 < limit < (total or math.inf):
            total, source = limit, "cgroup v2 /sys/fs/cgroup/memory.max"
    except (OSError, ValueError):
        pass
    return total, source


def available_memory_bytes() -> tuple[float, str]:
    """Memory a new process can take now without swapping (bytes), and where the figure
    came from: ``MemAvailable`` of ``/proc/meminfo`` (the kernel's own estimate, Linux 3.14+),
    lowered to what the cgroup v2 limit leaves (``memory.max`` - ``memory.current``) when
    one is set. (0, "") when neither can be read: unknown."""
    avail, source = _meminfo("MemAvailable")
    try:
        cgroup = Path("/sys/fs/cgroup")
        limit_text = (cgroup / "memory.max").read_text(encoding="ascii").strip()
        if limit_text != "max":
            left = float(limit_text) - float((cgroup / "memory.current").read_text(
                encoding="ascii").strip())
            if avail <= 0 or 0 <= left < avail:
                avail, source = max(left, 0.0), "cgroup v2 memory.max - memory.current"
    except (OSError, ValueError):
        pass
    return avail, source


def cpu_model() -> str:
    """The ``model name`` of ``/proc/cpuinfo`` (e.g. "Intel(R) Xeon(R) Processor"), or ""."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
