"""A user's hardware file: ``[[link]]`` and ``[[accelerator]]`` tables of TOML added to the
catalogs of :mod:`shardlab.config.hardware` (``--hardware-file``), every field checked.

A file only adds: a name (loosely) taken by the catalog, an alias, an earlier entry or this
machine's measurement is refused. Each number must lie in its physical range (:data:`PEAK`,
:data:`MEMORY`, :data:`BANDWIDTH`, :data:`LATENCY`, :data:`POWER`): each spans today's
devices and links by orders of magnitude either way; beyond them a number is a typo (1e308
bytes of memory overflowed the inference roofline; a 1e-300 FLOP/s peak made every step NaN).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from shardlab.config.files import read_input_text
from shardlab.config.hardware import (
    ACCELERATORS,
    ALIASES,
    LINKS,
    MEASURED_NAMES,
    PEAK_DTYPES,
    Accelerator,
    Link,
    with_nics,
)
from shardlab.config.limits import MAX_GPUS
from shardlab.config.lookup import find, normalize
from shardlab.errors import (
    SpecError,
    require_int_at_most,
    require_number_in,
    require_positive_int,
)

PEAK = (1e6, 1e18, "FLOP/s")
MEMORY = (1e6, 1e15, "bytes")
BANDWIDTH = (1e3, 1e15, "bytes/s")
LATENCY = (1e-9, 10.0, "s")
POWER = (1.0, 1e5, "W")
"""(lowest, highest, unit) a file may state for a peak, memory, a bandwidth (HBM or link),
a link's latency and board power."""

LINK_KEYS: tuple[str, ...] = ("name", "bandwidth", "latency", "source")
ACCELERATOR_KEYS: tuple[str, ...] = ("name", "peak_flops", "memory_bytes", "memory_bandwidth",
                                     "power_watts", "gpus_per_node", "intra_link",
                                     "inter_link", "source", "nics_per_node", "nic_gbps",
                                     "host_link")
FILE_TABLES: tuple[str, ...] = ("link", "accelerator")


def _known_keys(where: str, raw: dict, allowed: tuple[str, ...], what: str = "key") -> None:
    """SpecError naming the first key of ``raw`` that is not in ``allowed`` (a typo such as
    ``gpus_per_nod`` would otherwise leave the default in place unseen)."""
    for key in raw:
        if key not in allowed:
            raise SpecError(where, key, f"unknown {what}; allowed: {', '.join(allowed)}")


def _new_name(where: str, raw: dict, taken: dict[str, str]) -> str:
    """The entry's ``name``, refused when it (loosely, :func:`~shardlab.config.lookup.
    normalize`) names a catalog entry, an alias, an earlier entry or this machine's
    measurement: a file adds entries and never silently replaces one."""
    if "name" not in raw:
        raise SpecError(f"{where}.name", None, "is missing")
    name = raw["name"]
    if not isinstance(name, str) or not normalize(name):
        raise SpecError(f"{where}.name", name, "must be a name with a letter or digit")
    if normalize(name) in taken:
        raise SpecError(f"{where}.name", name, f"is taken by {taken[normalize(name)]}: a "
                        "file adds entries and never replaces one; give yours its own name")
    return name


def _link(where: str, raw: object, links: dict[str, Link]) -> Link:
    if isinstance(raw, str):
        return find(where, raw, links)
    if not isinstance(raw, dict):
        raise SpecError(where, raw, "must be a link name or a table {name, bandwidth, latency}")
    _known_keys(where, raw, LINK_KEYS)
    try:
        return Link(str(raw["name"]),
                    require_number_in(f"{where}.bandwidth", raw["bandwidth"], *BANDWIDTH),
                    require_number_in(f"{where}.latency", raw["latency"], *LATENCY),
                    str(raw.get("source", "")))
    except KeyError as e:
        raise SpecError(f"{where}.{e.args[0]}", None, "is missing") from None


def _tables(data: dict, key: str) -> list[dict]:
    """The ``[[key]]`` array of tables of a TOML document (empty when absent)."""
    items = data.get(key, [])
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise SpecError(key, items, f"must be an array of tables written [[{key}]]")
    return items


def _taken(entries: dict[str, object], aliases: dict[str, tuple[str, ...]], what: str
           ) -> dict[str, str]:
    """Normalized name -> what holds it, for every catalog name and alias."""
    out = {normalize(n): f"the catalog's {what} {n}" for n in entries}
    out.update({normalize(a): f"the catalog's {what} {n} (alias {a!r})"
                for n, names in aliases.items() for a in names})
    return out


def _peaks(where: str, flops: object) -> dict[str, float]:
    if not isinstance(flops, dict) or not flops:
        raise SpecError(where, flops, "must be a table of dtype = FLOP/s, e.g. { bf16 = 1e15 }")
    _known_keys(where, flops, PEAK_DTYPES, "dtype")
    return {k: require_number_in(f"{where}.{k}", v, *PEAK) for k, v in flops.items()}


def load_hardware_file(path: str | Path) -> tuple[dict[str, Accelerator], dict[str, Link]]:
    """Read a user TOML file of ``[[link]]`` and ``[[accelerator]]`` tables.

    Returns the catalogs with the file's entries added. A file only adds: an entry whose
    name (loosely) is already taken, by the catalog, an alias, an earlier entry or this
    machine's measurement ("cpu"), is refused, as is any key or dtype not in
    :data:`LINK_KEYS`, :data:`ACCELERATOR_KEYS`, :data:`PEAK_DTYPES`. The file must be a
    regular file of at most 1 MiB (:func:`~shardlab.config.files.read_input_text`). Any
    missing or bad field is a SpecError naming it.
    """
    p = Path(path)
    text = read_input_text("hardware_file", p)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError("hardware_file", str(p), f"is not valid TOML ({e})") from None
    for key in data:
        if key not in FILE_TABLES:
            raise SpecError("hardware_file", key, "unknown table or key; allowed: [[link]] "
                            "and [[accelerator]]")
    links = dict(LINKS)
    taken = _taken(LINKS, {}, "link")
    for i, raw in enumerate(_tables(data, "link")):
        where = f"link[{i}]"
        _known_keys(where, raw, LINK_KEYS)
        name = _new_name(where, raw, taken)
        link = _link(where, raw, links)
        links[link.name] = link
        taken[normalize(name)] = f"{where}"
    accels = dict(ACCELERATORS)
    taken = _taken(ACCELERATORS, ALIASES, "accelerator")
    taken.update({normalize(n): "this machine's measurement (--gpu cpu)" for n in MEASURED_NAMES})
    for i, raw in enumerate(_tables(data, "accelerator")):
        where = f"accelerator[{i}]"
        _known_keys(where, raw, ACCELERATOR_KEYS)
        name = _new_name(where, raw, taken)
        try:
            acc = Accelerator(
                name=name,
                peak_flops=_peaks(f"{where}.peak_flops", raw["peak_flops"]),
                memory_bytes=require_number_in(f"{where}.memory_bytes", raw["memory_bytes"],
                                               *MEMORY),
                memory_bandwidth=require_number_in(f"{where}.memory_bandwidth",
                                                   raw["memory_bandwidth"], *BANDWIDTH),
                power_watts=require_number_in(f"{where}.power_watts", raw["power_watts"],
                                              *POWER),
                intra_link=_link(f"{where}.intra_link", raw["intra_link"], links),
                inter_link=_link(f"{where}.inter_link", raw["inter_link"], links),
                host_link=(_link(f"{where}.host_link", raw["host_link"], links)
                           if "host_link" in raw else None),
                gpus_per_node=require_int_at_most(
                    f"{where}.gpus_per_node",
                    require_positive_int(f"{where}.gpus_per_node", raw.get("gpus_per_node", 8)),
                    MAX_GPUS),
                source=str(raw.get("source", f"user file {p}")),
            )
        except KeyError as e:
            raise SpecError(f"{where}.{e.args[0]}", None, "is missing") from None
        if "nics_per_node" in raw or "nic_gbps" in raw:
            acc = with_nics(acc, raw.get("nics_per_node"), raw.get("nic_gbps"))
        accels[acc.name] = acc
        taken[normalize(name)] = where
    return accels, links


def find_accelerator(name: str, hardware_file: str | Path | None = None) -> Accelerator:
    """The accelerator ``name`` names, from the catalog and the optional user file."""
    accels = load_hardware_file(hardware_file)[0] if hardware_file else ACCELERATORS
    return find("gpu", name, accels, ALIASES)
