"""Checkpoint save and load speed: shardlab's DCP path against a plain ``torch.save``.

For a llama-style TransformerLM at a few widths, the state a checkpoint holds (fp32
weights and AdamW's two moments after one step: 12 bytes per parameter) is written and
read back two ways, in one process on this machine's disk:

* ``dcp``: what ``shardlab train --checkpoint-dir`` does per rank: ``get_state_dict``
  (flattened optimizer), ``dcp.save`` through ``FileSystemWriter`` (fsync on), and
  ``dcp.load`` through shardlab's restricted metadata reader, plus the SHA-256 of every
  file that the manifest records and ``verify`` checks before a resume;
* ``torch.save``: the same tensors in one file, and ``torch.load(weights_only=True)``.

Prints MB/s (decimal, state bytes / median seconds of ``--repeats`` runs) and the ratio
dcp / torch.save; the claim is that both scale with the size (MB/s roughly flat) and
that the DCP path stays within a small factor of the plain one.

    python benchmarks/checkpoint_io.py [--widths 256 512 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from shardlab.config.model import ModelShape
from shardlab.distributed.checkpoint_manifest import sha256_file
from shardlab.distributed.checkpoint_reader import safe_load_planner, safe_reader
from shardlab.nn.model import TransformerLM


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(width: int, repeats: int, work: Path) -> dict[str, float]:
    """Seconds to save and load one width's state both ways, and its bytes."""
    shape = ModelShape(f"w{width}", 4, width, 8, 4096, 128, style="llama", tied=False)
    model = TransformerLM(shape)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    opt.step()  # the moments exist
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model_sd, optim_sd = get_state_dict(model, opt, options=options)
    state = {"model": model_sd,
             "optim": {k: v for k, v in optim_sd.items() if k.startswith("state.")}}
    size = sum(t.numel() * t.element_size() for part in state.values()
               for t in part.values())
    folder, single = work / "dcp", work / "state.pt"

    def dcp_save() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)
        for p in folder.rglob("*"):  # what the manifest records
            sha256_file(p)

    def dcp_load() -> None:
        for p in folder.rglob("*"):  # what verify checks before a resume
            sha256_file(p)
        target = {k: {n: torch.empty_like(t) for n, t in part.items()}
                  for k, part in state.items()}
        dcp.load(target, storage_reader=safe_reader(folder),
                 planner=safe_load_planner(), no_dist=True)

    def plain_save() -> None:
        torch.save(state, single)

    def plain_load() -> None:
        torch.load(single, weights_only=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "single process" notices
        return {"bytes": size, "dcp_save": _median_s(dcp_save, repeats),
                "dcp_load": _median_s(dcp_load, repeats),
                "torch_save": _median_s(plain_save, repeats),
                "torch_load": _median_s(plain_load, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'state MB':>9} {'dcp save':>9} {'torch.save':>10} {'ratio':>6} "
          f"{'dcp load':>9} {'torch.load':>10} {'ratio':>6}   (MB/s, decimal)")
    with tempfile.TemporaryDirectory() as tmp:
        for width in args.widths:
            r = measure(width, args.repeats, Path(tmp))
            mb = r["bytes"] / 1e6
            rates = {k: mb / r[k] for k in ("dcp_save", "torch_save", "dcp_load", "torch_load")}
            print(f"{mb:9.1f} {rates['dcp_save']:9.0f} {rates['torch_save']:10.0f} "
                  f"{rates['dcp_save'] / rates['torch_save']:6.2f} {rates['dcp_load']:9.0f} "
                  f"{rates['torch_load']:10.0f} {rates['dcp_load'] / rates['torch_load']:6.2f}")


if __name__ == "__main__":
    main()
