"""Every storage one micro-batch of a dry run saves for backward, one line per kind.

The saved-tensor meter (``src/shardlab/distributed/saved.py``) reports one number per
micro-batch; this diagnostic lists what makes it up, so that a term the count
(``train/report_activations.predicted_activation_bytes``) charges and the program does not
keep, or keeps and the count misses, shows as a line: each distinct storage recorded once,
grouped by (kind, dtype, shape), with its bytes and how many there are, beside the count.
It found, on 2026-12-07, that the eager count charged q and k before rotation and a copy of
the attention kernel's output, which the program does not keep, and missed the rotary
tables FSDP's mixed precision casts per block and autocast's per-linear input copies.

Run it with ``shardlab dryrun``'s own arguments (rank 0, in this process)::

    python benchmarks/saved_storages.py --gpus 4 --layout "dp=2 tp=2" --layers 2 \\
        --d-model 128 --heads 4 --seq 64 --global-batch 4 --dtype bf16
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import torch

from shardlab.cli import build_parser
from shardlab.cli.dryrun import config_from
from shardlab.distributed import saved
from shardlab.distributed.inner import data_tensors
from shardlab.dryrun.role import run_role
from shardlab.train.report_activations import predicted_activation_bytes

Kind = tuple[str, str, tuple[int, ...], tuple[str, ...]]


def main(argv: list[str]) -> None:
    found: collections.Counter[Kind] = collections.Counter()
    sizes: dict[Kind, int] = {}
    packer = saved._packer

    def listing(seen: dict[int, int]) -> Any:
        pack, record = packer(seen)

        def listed(t: torch.Tensor) -> None:
            before = set(seen)
            record(t)
            added = sum(n for key, n in seen.items() if key not in before)
            if added:
                kind = (type(t).__name__, str(t.dtype), tuple(t.shape),
                        tuple(str(x.dtype) for x in data_tensors(t)))
                found[kind] += 1
                sizes[kind] = added

        def pack_listed(t: torch.Tensor) -> torch.Tensor:
            listed(t)
            return t

        del pack  # the meter's own pack hook records; this one records and lists
        return pack_listed, listed

    saved._packer = listing
    cfg = config_from(build_parser().parse_args(["dryrun", *argv]))
    role = run_role(cfg, 0)
    total = role["saved_bytes_per_microbatch"]
    counted = predicted_activation_bytes(cfg, role["pp_rank"])
    print(f"saved per micro-batch: {total:,} B; the count {counted:,.0f} B "
          f"(saved / count {total / counted:.4f})")
    listed = sum(n * sizes[kind] for kind, n in found.items())
    print(f"listed below, over every forward the role ran: {listed:,} B "
          f"({listed / total:.2f} x the per-micro-batch figure)")
    print(f"{'bytes':>12} {'n':>3}  kind, dtype, shape, data dtypes")
    for kind, n in sorted(found.items(), key=lambda kv: -kv[1] * sizes[kv[0]]):
        print(f"{n * sizes[kind]:>12,} {n:>3}  {kind}")


if __name__ == "__main__":
    main(sys.argv[1:])
