"""Seed 002's experiments on two real gloo ranks, plus their single-process helpers.

The session's two-rank launch (tests/verify/conftest.py) runs all four experiments in each
rank, with the seed-001 experiments, through the runner, so the launch's few seconds of
process start-up are paid once; every check must pass on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from shardlab.nn.model import TransformerLM
from shardlab.verify import checkpointing, ddp, precision, tp_algebra
from shardlab.verify.registry import EXPERIMENTS

pytestmark = pytest.mark.multiprocess

NAMES = ["ddp_token_weighting", "activation_checkpointing", "tp_algebra", "precision"]


@pytest.fixture(scope="module")
def per_rank(launched: Callable[[int], tuple[list[dict[str, Any]], Path]]
             ) -> list[dict[str, Any]]:
    return launched(2)[0]


@pytest.fixture(scope="module")
def work(launched: Callable[[int], tuple[list[dict[str, Any]], Path]]) -> Path:
    return launched(2)[1]


def test_registry_points_at_these_modules() -> None:
    modules = {ddp, checkpointing, tp_algebra, precision}
    assert {EXPERIMENTS[n][0] for n in NAMES} == {m.__name__ for m in modules}


@pytest.mark.parametrize("name", NAMES)
def test_every_check_passes_on_every_rank(per_rank: list[dict[str, Any]], name: str) -> None:
    assert len(per_rank) == 2
    names = [[c["name"] for c in r[name]["checks"]] for r in per_rank]
    assert names[0] == names[1] and names[0], "ranks report the same, non-empty checks"
    failed = [(rank, c) for rank, r in enumerate(per_rank) for c in r[name]["checks"]
              if not c["passed"]]
    assert not failed, failed


def test_ddp_values(per_rank: list[dict[str, Any]]) -> None:
    checks = {c["name"]: c for c in per_rank[0]["ddp_token_weighting"]["checks"]}
    assert checks["params_identical_across_ranks"]["value"] == 0.0
    assert checks["mean_of_means_differs"]["value"] > 1e-2  # far above the 1e-3 threshold


def test_checkpointing_values(per_rank: list[dict[str, Any]]) -> None:
    checks = {c["name"]: c for c in per_rank[0]["activation_checkpointing"]["checks"]}
    assert 0 < checks["saved_bytes_fall"]["value"] < 0.5
    assert checks["block_forwards_double"]["value"] == 2 * checkpointing.SHAPE.layers


# --- single process, no process group -------------------------------------------------

def test_uneven_batch_gives_ranks_very_different_token_counts() -> None:
    batch = ddp.uneven_batch()
    per_seq = batch.loss_mask.sum(dim=1).tolist()
    assert per_seq == sorted(per_seq) and per_seq[-1] >= 5 * per_seq[0]
    first, last = batch.split(2)
    assert last.real_tokens > 2 * first.real_tokens


def test_measure_counts_unique_storages_and_block_calls() -> None:
    model = TransformerLM(checkpointing.SHAPE, seed=checkpointing.MODEL_SEED)
    batch = checkpointing.garden_batch()
    plain = checkpointing.measure(model, batch, checkpointed=False)
    ckpt = checkpointing.measure(model, batch, checkpointed=True)
    layers, (b, s), d = checkpointing.SHAPE.layers, batch.input_ids.shape, model.shape.d_model
    assert (plain.block_calls, ckpt.block_calls) == (layers, 2 * layers)
    assert plain.held_input_bytes == 0
    # the checkpoints hold each block's fp32 input, the bool mask and the rope cos/sin once
    hd = model.shape.head_dim
    assert ckpt.held_input_bytes == layers * b * s * d * 4 + b * s * s + 2 * s * hd * 4
    assert ckpt.kept_bytes < plain.kept_bytes
    assert torch.equal(plain.logits, ckpt.logits)
    assert all(torch.equal(x, y) for x, y in zip(plain.grads, ckpt.grads, strict=True))
    # the caller's model is untouched: no grads, no hooks left behind
    assert all(p.grad is None for p in model.parameters())
    assert all(not blk._forward_pre_hooks for blk in model.blocks)


def test_representation_table() -> None:
    rows = {(r.label, r.fmt): r for r in precision.table()}
    assert len(rows) == 3 * len(precision.SAMPLES)
    assert rows["0.1", "fp16"].stored == 0.0999755859375
    assert rows["0.1", "bf16"].stored == 0.10009765625
    assert rows["65504", "fp16"].stored == 65504.0 and rows["65504", "bf16"].stored == 65536.0
    assert math.isinf(rows["65520", "fp16"].stored) and rows["65520", "bf16"].stored == 65536.0
    assert rows["60000", "fp16"].stored == 60000.0
    assert rows["1e5+0.5", "fp16"].kind == "inf (overflow)"
    assert rows["1e5+0.5", "bf16"].stored == 99840.0
    assert rows["1e-8", "fp16"].kind == "zero (underflow)"
    assert rows["1e-8", "bf16"].kind == "normal"
    assert rows["1e5+0.5", "fp32"].abs_error == 0.0


def test_autocast_dtypes() -> None:
    assert precision.autocast_dtypes() == (torch.bfloat16, torch.float32, torch.float32, True)


def test_tp_operands_are_the_same_on_every_call() -> None:
    x1, w1 = tp_algebra.operands(2, torch.device("cpu"))
    x2, w2 = tp_algebra.operands(2, torch.device("cpu"))
    assert torch.equal(x1, x2) and torch.equal(w1, w2) and x1.dtype == torch.float64
    assert x1.shape[1] == w1.shape[0] == 2 * tp_algebra.K_PER_RANK


def test_experiments_write_nothing(per_rank: list[dict[str, Any]], work: Path) -> None:
    assert [p for n in NAMES for p in (work / n).rglob("*") if p.is_file()] == []


def test_each_experiment_is_quick(per_rank: list[dict[str, Any]]) -> None:
    # < 5 s each on 2 ranks is the budget; the bound here leaves room for a loaded machine
    assert all(r[n]["seconds"] < 15 for r in per_rank for n in NAMES)
