"""The predicted-vs-measured table's data-parallel bytes on sizes dp does not divide: torch's
FSDP2 pads every parameter's dim 0 to a multiple of dp, and the cost model pads the same.

The figures are what real runs measured (``shardlab train ARGS --steps 3 --json``, gloo on
the 2-core build machine, torch 2.13; re-measured 2026-12-07 after the final norm and head
became a unit FSDP2 keeps gathered from forward to backward): rank 0's data-parallel bytes
in the measured step.
No rank is started here: the table is built from the run's configuration alone."""

from __future__ import annotations

import pytest

from shardlab.cli import build_parser
from shardlab.cli.train import check
from shardlab.train.report import comm_table


@pytest.mark.parametrize(("argv", "measured"), [
    (["--dp", "3"], 2_275_808),  # ZeRO-3: 2 gathers (the kept head 1) + 1 scatter
    (["--dp", "3", "--dp-mode", "fsdp-zero2"], 1_535_072),   # 1 gather + 1 scatter
    (["--dp", "3", "--dtype", "bf16"], 1_521_672),           # bf16 gathers, fp32 scatter
    (["--dp", "5", "--global-batch", "10"], 2_725_152),
    (["--dp", "3", "--tp", "2"], 1_140_192),                 # FSDP over tensor-parallel shards
    (["--style", "gpt", "--dp", "3", "--pp", "2", "--micro-batch", "2"], 610_176),
], ids=lambda a: " ".join(a) if isinstance(a, list) else str(a))
def test_fsdp2_bytes_on_odd_dp_equal_a_real_runs(argv: list[str], measured: int) -> None:
    args = build_parser().parse_args(["train", *argv, "--steps", "3"]
                                     + ([] if "--global-batch" in argv else
                                        ["--global-batch", "12"]))
    cfg = check(args)[0]
    ranks = [{"rank": r, "pp_rank": (r // cfg.tp) % cfg.pp, "dp_rank": r // (cfg.tp * cfg.pp),
              "comm_step": {"by_dim": {}}} for r in range(cfg.world)]
    rows = comm_table(cfg, ranks)
    assert rows[0]["dp"]["predicted"] == measured
    # The padded shards are equal, so every rank of a stage sends the same.
    assert len({row["dp"]["predicted"] for row in rows}) == cfg.pp


def test_fsdp2_bytes_of_experts_on_uneven_shards_equal_a_real_runs() -> None:
    """A mixture of experts at dp=4, ep=2: FSDP2 shards the dense parameters over the 4
    data-parallel ranks and each rank's 3 experts (6 / ep) over its 2 expert-data-parallel
    replicas, padding both; rank 0's bytes in the measured step of ``shardlab train
    --layers 3 --d-model 32 --experts 6 --top-k 2 --shared-experts 1 --dense-layers 1
    --expert-d-ff 24 --dp 4 --ep 2 --steps 3 --json``."""
    args = build_parser().parse_args([
        "train", "--layers", "3", "--d-model", "32", "--experts", "6", "--top-k", "2",
        "--shared-experts", "1", "--dense-layers", "1", "--expert-d-ff", "24", "--dp", "4",
        "--ep", "2", "--steps", "3"])
    cfg = check(args)[0]
    ranks = [{"rank": r, "pp_rank": 0, "dp_rank": r, "tp_rank": 0, "ep_rank": r % 2,
              "routing": [], "comm_step": {"by_dim": {}}} for r in range(cfg.world)]
    rows = comm_table(cfg, ranks)
    assert (rows[0]["dp"]["predicted"], rows[0]["edp"]["predicted"]) == (344_064, 110_592)
