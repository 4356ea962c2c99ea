"""Human-readable numbers: decimal SI prefixes, and bytes in GB with GiB beside them.

Decimal (1 GB = 1e9 bytes) is what spec sheets use; binary (1 GiB = 2**30 bytes)
is what ``nvidia-smi`` and allocators report. Byte figures say which.
"""

from __future__ import annotations

_DECIMAL = (("Y", 1e24), ("Z", 1e21), ("E", 1e18), ("P", 1e15), ("T", 1e12),
            ("G", 1e9), ("M", 1e6), ("K", 1e3))
_BINARY = (("Ei", 2.0**60), ("Pi", 2.0**50), ("Ti", 2.0**40), ("Gi", 2.0**30),
           ("Mi", 2.0**20), ("Ki", 2.0**10))


def _scaled(x: float, unit: str, table: tuple[tuple[str, float], ...], digits: int) -> str:
    if x == 0:
        return f"0 {unit}".rstrip()
    sign = "-" if x < 0 else ""
    ax = abs(x)
    for prefix, scale in table:
        if ax >= scale:
            return f"{sign}{ax / scale:.{digits}f} {prefix}{unit}"
    return f"{sign}{ax:.{digits}f} {unit}".rstrip()


def human(x: float, unit: str = "", digits: int = 2) -> str:
    """``1.2e24, "FLOP"`` -> ``"1.20 YFLOP"``: decimal prefixes K M G T P E Z Y (powers of 1000)."""
    return _scaled(float(x), unit, _DECIMAL, digits)


def human_bytes(n: float, digits: int = 2) -> str:
    """Bytes in decimal units with the binary figure beside: ``"1.60 TB (1.46 TiB)"``."""
    dec = _scaled(float(n), "B", _DECIMAL, digits)
    if abs(n) < 1000:
        return dec
    return f"{dec} ({_scaled(float(n), 'B', _BINARY, digits)})"


def human_gib(n: float, digits: int = 2) -> str:
    """Bytes in binary units only: ``2**30`` -> ``"1.00 GiB"``."""
    return _scaled(float(n), "B", _BINARY, digits)


def human_seconds(t: float) -> str:
    """Seconds in the largest unit that keeps the number readable (ns up to days)."""
    if t == 0:
        return "0 s"
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0),
                        ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(t) >= scale:
            return f"{t / scale:.2f} {unit}"
    return f"{t:.2e} s"
