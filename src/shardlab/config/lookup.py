"""Loose, case-insensitive lookup of catalog names, with suggestions on a miss.

``"A100"``, ``"a100-80gb"`` and ``"NVIDIA A100 SXM 80GB"`` all find the same
entry: names and aliases are compared with case, spaces, dashes, underscores and
dots removed; a unique key that starts with the query wins next, then a unique
key that contains it. Anything else is a :class:`SpecError` that lists the close
names (``difflib``) or, for an ambiguous query, the candidates.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

from shardlab.errors import SpecError

T = TypeVar("T")


def normalize(name: str) -> str:
    """Lowercase, keep only letters and digits: ``"Llama-3.1 405B"`` -> ``"llama31405b"``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find(kind: str, query: str, entries: Mapping[str, T],
         aliases: Mapping[str, Iterable[str]] | None = None) -> T:
    """Return the entry of ``entries`` (keyed by canonical name) that ``query`` names.

    ``kind`` names the field in the error (``"model"``, ``"gpu"``). ``aliases`` maps a
    canonical name to extra names that find it exactly.
    """
    keys: dict[str, str] = {}
    for name in entries:
        keys[normalize(name)] = name
        for alias in (aliases or {}).get(name, ()):
            keys[normalize(alias)] = name
    q = normalize(query)
    if not q:
        raise SpecError(kind, query, "must name a catalog entry")
    if q in keys:
        return entries[keys[q]]
    for test in (str.startswith, str.__contains__):
        hits = sorted({keys[k] for k in keys if test(k, q)})
        if len(hits) == 1:
            return entries[hits[0]]
        if len(hits) > 1:
            raise SpecError(kind, query, f"is ambiguous: one of {', '.join(hits)}")
    close = difflib.get_close_matches(q, list(keys), n=4, cutoff=0.5)
    names = sorted({keys[k] for k in close})
    hint = f"did you mean {', '.join(names)}?" if names else "not in the catalog"
    raise SpecError(kind, query, f"unknown; {hint} (list them with `shardlab "
                    f"{'models' if kind == 'model' else 'hardware'}`)")
