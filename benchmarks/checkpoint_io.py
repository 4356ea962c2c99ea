"""Checkpoint save and load speed: shardlab's DCP path against a plain ``torch.save``.

For a llama-style TransformerLM at a few widths, the state a checkpoint holds (fp32
weights and AdamW's two moments after one step: 12 bytes per parameter) is written and
read back two ways, in one process (a one-rank gloo group) on this machine's disk:

* ``dcp``: what ``shardlab train --checkpoint-dir`` and ``--resume`` do per rank, through
  :class:`~shardlab.distributed.checkpoint.Checkpointer` itself. Save: ``get_state_dict``,
  ``dcp.save`` through :class:`~shardlab.distributed.checkpoint_writer.RawWriter` (raw
  bytes, XXH3-64 while writing, fsync), the manifest, the folder's fsync and its atomic
  rename. Load: :func:`~shardlab.distributed.checkpoint_manifest.verify` (every file's
  XXH3-64, as ``train --resume`` does before any rank starts) and
  :meth:`~shardlab.distributed.checkpoint.Checkpointer.load` (DCP's load through the
  restricted reader, then ``set_state_dict``);
* ``torch.save``: the same tensors in one new file, with and without ``os.fsync``, and
  ``torch.load(weights_only=True)`` of it (no copy into the model counted).

The save ratio is dcp / (``torch.save`` + fsync): a checkpoint is renamed into place
only once its bytes are on disk, so the plain path is timed with the same durability;
dcp / ``torch.save`` alone (bytes left in the page cache) is printed beside it.

Loads read files just written, from the page cache, and are timed two ways, because
what they cost depends on whether their memory is already mapped (glibc is set to keep
freed memory, ``mallopt``). ``load``: as a resumed run's fresh process does it: freed
memory is first returned to the system (``malloc_trim``), so ``torch.load`` faults in
every page it fills, and the DCP load gets a fresh AdamW whose state it creates and
fills (the model exists, as in a resume). ``warm load``: ``torch.load`` reuses the
memory the previous one freed, and DCP loads into the live optimizer's state: no page is
faulted in either way. ``async s``: how long ``Checkpointer.save`` holds training with
``async_save`` (staging the CPU copy; the write goes on in the background). Each figure
is the median of ``--repeats`` runs, the ways interleaved, each after an ``os.sync()``;
MB/s are decimal (state bytes / seconds).

    python benchmarks/checkpoint_io.py [--widths 256 512 768 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from shardlab.config.model import ModelShape
from shardlab.distributed.checkpoint import Checkpointer
from shardlab.distributed.checkpoint_manifest import step_dir, verify
from shardlab.nn.model import TransformerLM

WAYS = ("dcp_save", "torch_save_fsync", "torch_save", "async_save", "dcp_load",
        "torch_load", "dcp_load_warm", "torch_load_warm", "verify")
# glibc's mallopt parameters (malloc.h): serve blocks up to 32 MiB (its maximum; every
# tensor here is smaller) from the heap, and never give freed heap memory back unasked.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt  # noqa: B018 (glibc's, absent from other C libraries)
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def _seconds(fn: Callable[[], object]) -> float:
    os.sync()  # no dirty pages of an earlier run are written back during this one
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(width: int, repeats: int, work: Path, libc: ctypes.CDLL) -> dict[str, float]:
    """Median seconds of each way for one width's state, and its bytes."""
    shape = ModelShape(f"w{width}", 4, width, 8, 4096, 128, style="llama", tied=False)
    model = TransformerLM(shape)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    opt.step()  # the moments exist
    model.zero_grad(set_to_none=True)  # as a resumed run's model is
    history = {"losses": [1.0], "grad_norms": [1.0]}
    args = {"rank": 0, "world": 1, "keep": 1_000, "meta": {"data": {}}}
    sync = Checkpointer(str(work / "sync"), [model], opt, sched, async_save=False, **args)
    background = Checkpointer(str(work / "async"), [model], opt, sched, async_save=True,
                              **args)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    size = sum(t.numel() * t.element_size() for t in [*state["model"].values(), *(
        v for s in state["optim"]["state"].values() for v in s.values())])
    single = work / "state.pt"

    def plain_save(fsync: bool) -> None:
        with single.open("wb") as f:
            torch.save(state, f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())

    def dcp_load(into: Checkpointer) -> None:
        into.load(step_dir(work / "sync", 1), verify(step_dir(work / "sync", 1)))

    def dcp_load_fresh() -> float:
        """Seconds of a resumed rank's load: the model, a new AdamW without state."""
        new = torch.optim.AdamW(model.parameters(), foreach=False)
        resumed = Checkpointer(str(work / "sync"), [model], new,
                               torch.optim.lr_scheduler.LambdaLR(new, lambda _: 1.0),
                               async_save=False, **args)
        libc.malloc_trim(0)  # freed memory back to the system, as in a new process
        return _seconds(lambda: dcp_load(resumed))

    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(repeats):  # the ways interleaved, so a busy moment hits them all
        for folder in (work / "sync", work / "async"):
            shutil.rmtree(folder, ignore_errors=True)
        single.unlink(missing_ok=True)
        times["dcp_save"].append(_seconds(lambda: sync.save(1, history)))
        times["torch_save_fsync"].append(_seconds(lambda: plain_save(True)))
        single.unlink()
        times["torch_save"].append(_seconds(lambda: plain_save(False)))
        times["async_save"].append(_seconds(lambda: background.save(1, history)))
        background.finish()
        times["dcp_load"].append(dcp_load_fresh())
        libc.malloc_trim(0)
        times["torch_load"].append(_seconds(lambda: torch.load(single, weights_only=True)))
        # reuses the memory the previous torch.load's tensors were freed from
        times["torch_load_warm"].append(_seconds(lambda: torch.load(single,
                                                                    weights_only=True)))
        times["dcp_load_warm"].append(_seconds(lambda: dcp_load(sync)))
        times["verify"].append(_seconds(lambda: verify(step_dir(work / "sync", 1))))
    return {"bytes": size, **{way: statistics.median(t) for way, t in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 512, 768, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    libc = _glibc()
    if libc is None:
        parser.error("needs glibc (mallopt, malloc_trim) to set how loads get memory")
    libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # a C int: up to 2 GiB of free heap kept
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    print(f"{'':8} {'save':-^44} {'load':-^24} {'warm load':-^24}")
    print(f"{'state MB':>8} {'dcp':>6} {'t.save+fsync':>12} {'ratio':>5} {'t.save':>7} "
          f"{'ratio':>5} {'dcp':>6} {'t.load':>7} {'ratio':>5} {'dcp':>6} {'t.load':>7} "
          f"{'ratio':>5} {'verify s':>8} {'async s':>7}   (MB/s, decimal)")
    try:
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # DCP's one-rank notices
            for width in args.widths:
                r = measure(width, args.repeats, Path(tmp), libc)
                mb = r["bytes"] / 1e6
                rate = {k: mb / r[k] for k in WAYS}
                print(f"{mb:8.1f} {rate['dcp_save']:6.0f} {rate['torch_save_fsync']:12.0f} "
                      f"{r['torch_save_fsync'] / r['dcp_save']:5.2f} "
                      f"{rate['torch_save']:7.0f} {r['torch_save'] / r['dcp_save']:5.2f} "
                      f"{rate['dcp_load']:6.0f} {rate['torch_load']:7.0f} "
                      f"{r['torch_load'] / r['dcp_load']:5.2f} "
                      f"{rate['dcp_load_warm']:6.0f} {rate['torch_load_warm']:7.0f} "
                      f"{r['torch_load_warm'] / r['dcp_load_warm']:5.2f} "
                      f"{r['verify']:8.3f} {r['async_save']:7.3f}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
