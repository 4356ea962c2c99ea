"""A training job's ranks started with a progress bar fed by rank 0's step log.

The launch runs in the calling (main) thread and the bar's reader in another: the
elastic agent catches SIGINT and SIGTERM, and stops every rank on them, only in the main
thread (:mod:`shardlab.distributed.launch`). Run in a helper thread, as before, the
agent set no handler, Ctrl-C left a traceback, and a signal sent to the main process
alone left the ranks training.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shardlab.distributed.launch import launch
from shardlab.train.config import TrainConfig

TARGET = "shardlab.train.loop:train_rank"


def last_step(log: Path) -> dict[str, Any] | None:
    """The last whole record of rank 0's step log, or None (none yet, or being written)."""
    try:
        lines = log.read_text().splitlines()
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def launch_training(cfg: TrainConfig, timeout_s: float, bar: bool) -> list[Any]:
    """Every rank's result of :func:`shardlab.train.loop.train_rank`, by rank; with ``bar``
    a transient progress bar shows rank 0's steps and loss from ``train.jsonl`` (a reader
    thread polls it every 0.2 s)."""
    if not bar:
        return launch(TARGET, cfg.world, (cfg,), timeout_s=timeout_s, log_dir=cfg.log_dir)
    log, done = Path(cfg.log_dir, "train.jsonl"), threading.Event()
    with Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                  TextColumn("{task.description}"), TimeElapsedColumn(),
                  transient=True) as progress:
        task = progress.add_task("starting ranks", total=cfg.steps)

        def follow() -> None:
            while not done.wait(0.2):
                last = last_step(log)
                if last is not None:
                    progress.update(task, completed=last["step"] + 1,
                                    description=f"loss {last['loss']:.4f}")

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        try:
            return launch(TARGET, cfg.world, (cfg,), timeout_s=timeout_s, log_dir=cfg.log_dir)
        finally:
            done.set()
            reader.join()
