"""What the virtual-group tests share: a group of ``p`` members and float64 inputs for it.

Imported by ``test_virtual_group.py`` (bytes, messages, seconds, the ledger) and
``test_virtual_group_results.py`` (what the collectives compute)."""

from __future__ import annotations

from typing import Any

import torch

from shardlab.sim.ledger import Ledger
from shardlab.sim.virtual_group import VirtualGroup

F64 = torch.float64


def group(p: int, ledger: Ledger | None = None, **kw: Any) -> VirtualGroup:
    """A data-parallel group of global ranks 0..p-1 recording into ``ledger`` (a fresh one
    by default); ``kw`` goes to :class:`VirtualGroup` (link, algorithm)."""
    return VirtualGroup(list(range(p)), ledger if ledger is not None else Ledger(p), "dp", **kw)


def members(p: int, *shape: int, seed: int = 0) -> list[torch.Tensor]:
    """``p`` float64 tensors of ``shape``, standard normal, from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=F64) for _ in range(p)]
