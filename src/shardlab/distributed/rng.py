"""Every random number generator a rank draws from, as JSON, and back.

A resumed run must continue every stream where the interrupted one left it: torch's CPU
generator (``torch.get_rng_state``, a 5056-byte Mersenne-Twister state), each CUDA
device's generator when CUDA is present (``torch.cuda.get_rng_state_all``), Python's
``random`` module (``random.getstate``: 625 32-bit words and a cached Gaussian) and
numpy's legacy global generator (``np.random.get_state``: 624 words, a position and a
cached Gaussian). shardlab's own training draws none of them today (the data stream is
seeded by step, there is no dropout), but a user's model or data may, and torchtitan and
Megatron restore all four for the same reason.

The state is plain JSON (integers, floats and base64 strings), so a checkpoint's RNG file
is data that is parsed, never unpickled. Python floats round-trip exactly through JSON
(``repr`` is shortest-exact since Python 3.1).
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch


def _bytes(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _tensor(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture() -> dict[str, Any]:
    """This process's generator states as a JSON-ready dict."""
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch_cpu": _bytes(torch.get_rng_state()),
        "python": {"version": version, "state": list(words), "gauss": gauss},
        "numpy": {"name": name, "keys": [int(k) for k in keys], "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = [_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore(state: dict[str, Any]) -> None:
    """Set this process's generators to ``state`` (from :func:`capture`)."""
    torch.set_rng_state(_tensor(state["torch_cpu"]))
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], np.array(n["keys"], dtype=np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    if "torch_cuda" in state and torch.cuda.is_available():
        cuda = state["torch_cuda"]
        # A job resumed on fewer devices restores the ones it has.
        torch.cuda.set_rng_state_all([_tensor(s) for s in cuda[:torch.cuda.device_count()]])
