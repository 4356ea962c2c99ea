"""Output helpers: one JSON document on stdout, or rich tables."""

from __future__ import annotations

import json
import math
import sys
from typing import Any


class Vouched(list[Any]):
    """A list written as it is, without :func:`_clean`'s walk: whoever builds it vouches
    that every float in it is finite and every dict key a str. For large parts that are
    clean by construction: the walk, a Python call per value, took 0.5 s of a schedule's
    131,072 actions (``shardlab schedule --json --actions``)."""


def _clean(x: Any) -> Any:
    # JSON has no inf/nan: write null rather than an invalid document.
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Vouched):
        return x
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def print_json(doc: Any, *, compact: bool = False) -> None:
    """Write ``doc`` as one JSON document on stdout: indented by two spaces, or with
    ``compact`` on one line without spaces, which ``json``'s C encoder writes (indentation
    runs its pure-Python encoder, 3-4x slower on a document of 100,000 objects, and
    ``json.dump`` to a stream always runs it)."""
    doc = _clean(doc)
    if compact:
        sys.stdout.write(json.dumps(doc, separators=(",", ":")))
    else:
        json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
