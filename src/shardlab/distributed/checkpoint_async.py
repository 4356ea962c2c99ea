"""Where a checkpoint may be written in the background, and the CPU copy it writes from.

``shardlab train`` saves asynchronously by default (``--no-async-save``: synchronously):
``dcp.async_save`` copies the rank's state into CPU memory (staging) and a background
thread writes that copy while training goes on. It is safe because of how
:class:`shardlab.distributed.checkpoint.Checkpointer` uses it:

* **in place as soon as written**: a second background thread waits for the write and
  then, over the same background group, does what a synchronous save does after its
  write (barrier, manifest, fsync, rename), so a crash at any later moment resumes from
  it; only a crash during the write itself (a fraction of a second per 500 MB here)
  loses it, and the run resumes from the one before;
* **one save in flight**: a save first waits for the previous one to be in place, so two
  never overlap and the staged copy is never overwritten while it is being written
  (which is what lets :func:`stager` reuse it);
* **the last checkpoint is complete on exit**: the training loop waits for the save in
  flight after the last step (``Checkpointer.finish``) before the rank returns;
* **a failure never shows a half checkpoint**: the folder is renamed into place only
  after every rank's write is done and the manifest is written; a rank that dies first
  leaves a ``step-N.tmp`` folder that loading ignores;
* **memory**: the staged copy holds the rank's whole state (12 bytes per parameter with
  fp32 AdamW) for the run. :func:`fits` allows it only when the copies of every rank on
  this host take at most :data:`MEMORY_SHARE` of the memory the host has available at
  the first save (:func:`shardlab.config.host.available_memory_bytes`: ``MemAvailable``,
  lowered to what a cgroup v2 limit leaves); otherwise the run saves synchronously
  (rank 0 says so once).

A run with an injected fault (the hidden ``--fail-at-step`` test flags) saves
synchronously (``TrainConfig.__post_init__``): the checkpoint its restart resumes from
must not depend on whether a background write had finished, and the SIGKILL inside a
save has its kill point in the main thread, before the rename.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.tensor import DTensor

from shardlab.config.host import available_memory_bytes

# The staged copies may take at most this share of the memory available when the first
# save starts: the rest is left for training's own swings (activations freed between
# steps are allocated again at the next one).
MEMORY_SHARE = 0.5


def staged_bytes(state: dict[str, Any]) -> int:
    """Bytes of this rank's share of ``state`` (a DTensor's local shard), as staged."""
    total = 0
    for part in state.values():
        for value in part.values():
            local = value.to_local() if isinstance(value, DTensor) else value
            if isinstance(local, torch.Tensor):
                total += local.numel() * local.element_size()
    return total


def fits(state: dict[str, Any], world: int, group: Any, rank: int) -> bool:
    """Whether every rank's host can hold the staged copies (collective over ``group``:
    every rank gets the same answer). Ranks on a host: ``LOCAL_WORLD_SIZE`` under
    torchrun, else all of them (shardlab's own launcher starts them on one host)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    need = staged_bytes(state) * local
    have, _ = available_memory_bytes()  # 0 when unknown: then saved synchronously
    ok = have > 0 and need <= MEMORY_SHARE * have
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    if not flag.item() and rank == 0:
        free = f"{have / 1e9:.2f} GB" if have > 0 else "unknown"
        sys.stderr.write(f"shardlab: checkpoints are saved synchronously: the background "
                         f"save's CPU copy ({need / 1e9:.2f} GB for {local} ranks on this "
                         f"host) would take more than {MEMORY_SHARE:.0%} of the memory "
                         f"available ({free})\n")
    return bool(flag.item())


def stager() -> DefaultStager:
    """DCP's stager, kept for the run: it copies into the CPU storages it allocated at the
    first save (pinned when CUDA is there, for faster device-to-host copies), so later
    saves neither allocate nor fault in that memory (528.6 MB of state on this host:
    0.29 s the first time, 0.11 s after)."""
    cuda = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                        use_async_staging=False, use_non_blocking_copy=False))
