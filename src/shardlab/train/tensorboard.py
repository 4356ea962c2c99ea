"""TensorBoard event files of a training run, written by rank 0 beside ``train.jsonl``.

Per step (TensorBoard's x axis is the step): ``train/loss``, ``train/grad_norm``,
``train/lr``, ``train/step_seconds``, ``train/tokens_per_s`` (tokens in the global batch
/ step seconds) and, when the job's peak FLOP/s is known, ``train/mfu``: model FLOPs per
token (:func:`shardlab.estimate.flops.flops_per_token`, 6N plus attention, PaLM's
definition: Chowdhery et al. 2022, App. B) x tokens / seconds / peak.

At the end of the run (at the step train measured): ``memory/rank{R}/{weights,gradients,
optimizer}`` bytes held, ``memory/rank{R}/activations`` kept per micro-batch,
``comm/rank{R}/{dp,tp,pp,...}`` bytes sent in the measured step, each beside its
prediction under ``predicted/...``, and the run's MFU. These come from the run's
document (:func:`shardlab.train.report.report`), so the dashboard shows the same
figures as ``--json`` and ``shardlab report run``.

The files are TensorBoard's event files (TFRecord-framed ``Event`` protocol buffers),
written through tensorboardX's synchronous ``EventsWriter``, not its ``SummaryWriter``,
whose background queue does not drain on ``flush()``: here every step is on disk when
``step`` returns, so ``tensorboard --logdir DIR`` follows a run while it trains. Rank 0's
per-step file and the launcher's end-of-run file carry different suffixes (``.steps``,
``.run``), so two writers started in the same second never share a file name.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.summary_pb2 import Summary

from shardlab.config.model import ModelShape
from shardlab.estimate.flops import flops_per_token

STATE = ("weights", "gradients", "optimizer")
MEASURED_STATE = {"weights": "params", "gradients": "grads", "optimizer": "optimizer"}


class RunBoard:
    """One writer's event file in ``directory`` (created when missing): ``suffix`` is
    ``"steps"`` for rank 0's per-step scalars, ``"run"`` for the launcher's summary."""

    def __init__(self, directory: str | Path, shape: ModelShape, seq: int,
                 peak_flops: float | None, suffix: str = "steps") -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.writer = EventsWriter(str(Path(directory, "events")), f".{suffix}")
        self.flops_per_token = flops_per_token(shape, seq).train
        self.peak = peak_flops

    def _write(self, step: int, scalars: dict[str, float]) -> None:
        """One event holding ``scalars`` at ``step``, on disk when this returns."""
        values = [Summary.Value(tag=tag, simple_value=float(v)) for tag, v in scalars.items()]
        self.writer.write_event(Event(wall_time=time.time(), step=step,
                                      summary=Summary(value=values)))
        self.writer.flush()

    def step(self, step: int, loss: float, grad_norm: float, lr: float, seconds: float,
             tokens: int) -> None:
        """One optimizer step's scalars (``tokens``: tokens in the global batch)."""
        scalars = {"train/loss": loss, "train/grad_norm": grad_norm, "train/lr": lr,
                   "train/step_seconds": seconds}
        if seconds > 0:
            scalars["train/tokens_per_s"] = tokens / seconds
            if self.peak:
                scalars["train/mfu"] = self.flops_per_token * tokens / seconds / self.peak
        self._write(step, scalars)

    def finish(self, doc: dict[str, Any]) -> None:
        """The run document's memory per rank and bytes per mesh dim, at the measured step."""
        scalars: dict[str, float] = {"run/tokens_per_s": doc["tokens_per_s"]}
        if doc.get("mfu") is not None:
            scalars["run/mfu"] = doc["mfu"]
        for m in doc.get("memory_per_rank", []):
            r = m["rank"]
            for key in STATE:
                held = (m.get("measured") or {}).get(MEASURED_STATE[key])
                if held is not None:
                    scalars[f"memory/rank{r}/{key}"] = held
                scalars[f"predicted/memory/rank{r}/{key}"] = m["predicted"][key]
            act = m.get("activations") or {}
            for which, prefix in (("measured", ""), ("predicted", "predicted/")):
                if act.get(which) is not None:
                    scalars[f"{prefix}memory/rank{r}/activations"] = act[which]
        for row in doc.get("comm_bytes_per_step", []):
            r = row["rank"]
            for dim, figures in row.items():
                if isinstance(figures, dict) and "measured" in figures:
                    scalars[f"comm/rank{r}/{dim}"] = figures["measured"]
                    scalars[f"predicted/comm/rank{r}/{dim}"] = figures["predicted"]
        self._write(int(doc.get("measured_step") or 0), scalars)

    def close(self) -> None:
        """Close the event file (everything is already on disk)."""
        self.writer.close()


def read_scalars(directory: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of every event file in ``directory``, by tag: [(step, value)] in file
    order. TFRecord framing (length u64, its CRC u32, the Event bytes, their CRC u32)
    around ``Event`` protocol buffers; the CRCs are not checked (a reader for tests and
    scripts, not a replacement for TensorBoard's)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(directory).glob("events.out.tfevents.*")):
        data = path.read_bytes()
        i = 0
        while i + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = Event()
            event.ParseFromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out

