"""Human-readable numbers: decimal prefixes, GB beside GiB."""

from shardlab.units import human, human_bytes, human_gib, human_seconds


def test_human() -> None:
    assert human(1.2e24, "FLOP") == "1.20 YFLOP"
    assert human(0) == "0"
    assert human(-2500, "B") == "-2.50 KB"
    assert human(999) == "999.00"


def test_bytes_say_decimal_and_binary() -> None:
    assert human_bytes(80e9) == "80.00 GB (74.51 GiB)"
    assert human_bytes(512) == "512.00 B"
    assert human_gib(2**30) == "1.00 GiB"


def test_seconds() -> None:
    assert human_seconds(86400 * 3) == "3.00 d"
    assert human_seconds(0.0025) == "2.50 ms"
    assert human_seconds(0) == "0 s"
