"""Which checkpoint a run continues from (``--resume [STEP]``, or a worker torchrun
restarted), verified before any rank starts: its files' checksums, the model shape and
the data stream it was written with (:mod:`shardlab.distributed.checkpoint_manifest`)."""

from __future__ import annotations

from typing import Any

from shardlab.distributed import checkpoint_manifest
from shardlab.errors import SpecError
from shardlab.train.config import TrainConfig


def data_record(cfg: TrainConfig) -> dict[str, Any]:
    """What a checkpoint's data position must match (``DATA_FIELDS`` of
    :mod:`shardlab.distributed.checkpoint_manifest`)."""
    return {"fingerprint": cfg.data_id, "seed": cfg.seed, "global_batch": cfg.global_batch,
            "seq": cfg.seq}


def resume_folder(cfg: TrainConfig, which: str | None) -> str:
    """The verified checkpoint folder to resume from ("" for a fresh start): ``which`` is
    ``--resume``'s value ("latest", a step, or None), and a restarted attempt
    (``cfg.attempt`` > 0) with checkpoints continues from the latest by itself."""
    restarted = cfg.attempt > 0 and checkpoint_manifest.complete_steps(cfg.checkpoint_dir)
    if which is None and restarted:
        which = "latest"  # a worker torchrun restarted: continue from the last checkpoint
    if which is None:
        return ""
    if not cfg.checkpoint_dir:
        raise SpecError("resume", which, "needs --checkpoint-dir (where the checkpoints are)")
    if which == "latest":
        step = None
    elif which.isdigit():
        step = int(which)
    else:
        raise SpecError("resume", which, "must be a step number, or nothing for the latest")
    folder = checkpoint_manifest.find(cfg.checkpoint_dir, step)
    doc = checkpoint_manifest.verify(folder)
    checkpoint_manifest.check_compatible(doc, cfg.shape, data_record(cfg), str(folder))
    if doc["step"] >= cfg.steps:
        raise SpecError("steps", cfg.steps, f"must be more than the checkpoint's step "
                        f"({doc['step']}) to continue training")
    return str(folder)
