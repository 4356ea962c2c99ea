"""What the virtual-group tests share: a group of ``p`` members and float64 inputs for it.

Imported by ``test_virtual_group.py`` (bytes, messages, seconds, the ledger) and
``test_virtual_group_results.py`` (what the collectives compute)."""

from __future__ import annotations

import torch

from shardlab.sim.ledger import Ledger
from shardlab.sim.virtual_group import VirtualGroup

F64 = torch.float64


def group(p: int, ledger: Ledger | None = None, **kw) -> VirtualGroup:
    return VirtualGroup(list(range(p)), ledger if ledger is not None else Ledger(p), "dp", **kw)


def members(p: int, *shape: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=F64) for _ in range(p)]
