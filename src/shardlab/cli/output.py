"""Output helpers: one JSON document on stdout, or rich tables."""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def _clean(x: Any) -> Any:
    # JSON has no inf/nan: write null rather than an invalid document.
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def print_json(doc: Any) -> None:
    """Write ``doc`` as one JSON document on stdout."""
    json.dump(_clean(doc), sys.stdout, indent=2)
    sys.stdout.write("\n")
