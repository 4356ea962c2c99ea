"""TP, SP, loss parallel, activation checkpointing, FSDP2 and DDP on shardlab's LM equal one
process on the whole batch, in float64 (tolerance 1e-10).

Every rank builds the unsharded reference (same seed) and runs it on the whole batch;
the parallelized copy runs on the rank's data-parallel share with
``loss = lm_loss_sum(share) / N * dp`` (N the global real-token count; ``x dp`` because
FSDP2 and DDP average gradients over dp ranks). Compared: the logits of the share, the
loss summed over dp ranks, every gradient (``full_tensor()`` of DTensors) and, where asked,
the parameters after one AdamW step. The rank functions live in this file; a tiny module
written to a temporary folder loads it so the launcher's spawned workers can import them.
The two-rank meshes (tp 2, dp 2) run in one launch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
)

from shardlab.config.model import ModelShape, MoE
from shardlab.distributed.activation_checkpoint import apply_ac
from shardlab.distributed.data_parallel import apply_ddp
from shardlab.distributed.launch import launch
from shardlab.distributed.measure import state_bytes
from shardlab.distributed.parallelize import parallelize
from shardlab.distributed.tensor_parallel import (
    block_plan,
    check_tp,
    lm_loss_sum_any,
    root_plan,
    tp_plan,
)
from shardlab.errors import SpecError
from shardlab.nn.data import Batch, make_batch
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import TransformerLM

pytestmark = pytest.mark.multiprocess

DTYPE = torch.float64
TOL = 1e-10
# bf16 compute (FSDP2 MixedPrecisionPolicy) against the float64 reference: relative to the
# largest reference value; bf16 keeps 8 significant bits (2**-9 ~ 2e-3 per rounding).
BF16_TOL = 5e-2
SEED = 3
SEQ = 16
V = garden_vocab().size  # 156: divisible by 2 and 4
SHAPES = {
    "llama": ModelShape("pz-llama", layers=2, d_model=32, heads=4, vocab=V, context=SEQ,
                        kv_heads=2, head_dim=8, d_ff=64, style="llama", tied=False),
    "gpt-tied": ModelShape("pz-gpt", layers=2, d_model=32, heads=4, vocab=V, context=SEQ,
                           style="gpt", tied=True),
    "gpt-untied": ModelShape("pz-gpt-u", layers=2, d_model=32, heads=4, vocab=V,
                             context=SEQ, style="gpt", tied=False),
    # Qwen3's query/key norms: weights shared by heads that tensor parallelism splits
    "qwen3": ModelShape("pz-qwen3", layers=2, d_model=32, heads=4, vocab=V, context=SEQ,
                        kv_heads=2, head_dim=16, d_ff=64, style="llama", tied=False,
                        qk_norm=True),
}


def the_batch() -> Batch:
    """Four garden documents, two of them shorter than SEQ + 1 (right padding)."""
    docs = garden_documents(16, seed=0)
    return make_batch([docs[i] for i in (0, 5, 10, 9)], SEQ)


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "")


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _max_diff(a: torch.Tensor | None, b: torch.Tensor | None, relative: bool = False) -> float:
    """max |a - b| (over max |b| when ``relative``); a DTensor ``a`` is gathered first."""
    if a is None or b is None:
        return float("inf")
    diff = float((_full(a).detach().double() - b.detach()).abs().max())
    return diff / float(b.abs().max()) if relative else diff


def _worst(diffs: Any) -> float:
    """The largest difference; NaN if any is NaN (Python's max would depend on order)."""
    return float(torch.tensor(list(diffs), dtype=DTYPE).max())


# --- rank functions (run by the launcher's workers) ---------------------------------------

def _case(mesh: Any, *, model: str, tp: int = 1, dp: int = 1, dp_mode: str = "fsdp",
          sp: bool = False, lp: bool = False, ac: str = "none", step: bool = False,
          bf16: bool = False) -> dict[str, Any]:
    shape, batch = SHAPES[model], the_batch()
    n = batch.real_tokens
    ref = TransformerLM(shape, DTYPE, seed=SEED)
    ref_logits = ref(batch.input_ids, batch.pad_mask)
    ref_loss = lm_loss_sum(ref_logits, batch.targets, batch.loss_mask) / n
    ref_loss.backward()

    net = parallelize(TransformerLM(shape, DTYPE, seed=SEED), mesh, tp=tp, dp=dp,
                      dp_mode=dp_mode, sp=sp, loss_parallel=lp, ac=ac,
                      param_dtype=torch.bfloat16 if bf16 else None)
    dp_rank = mesh["dp"].get_local_rank() if dp > 1 else 0
    share = batch.chunk(dp_rank, dp)
    logits = net(share.input_ids, share.pad_mask)
    with loss_parallel() if lp else contextlib.nullcontext():
        loss = lm_loss_sum_any(logits.double(), share.targets, share.loss_mask) / n * dp
        loss.backward()
    total = torch.tensor([float(_full(loss).detach()) / dp], dtype=DTYPE)
    if dp > 1:
        dist.all_reduce(total, group=mesh["dp"].get_group())
    per = batch.size // dp
    out: dict[str, Any] = {
        "case": f"{model} tp{tp} dp{dp} {dp_mode} sp={sp} lp={lp} ac={ac}"
                + (" bf16" if bf16 else ""),
        "tol": BF16_TOL if bf16 else TOL,
        "logits_dtensor": isinstance(logits, DTensor),
        "logits": _max_diff(logits, ref_logits[dp_rank * per:(dp_rank + 1) * per], bf16),
        "loss": abs(float(total) - float(ref_loss)) / (abs(float(ref_loss)) if bf16 else 1),
        "grads": _worst(_max_diff(p.grad, ref.get_parameter(_clean(k)).grad, bf16)
                        for k, p in net.named_parameters()),
        "dtensor_params": sum(isinstance(p, DTensor) for p in net.parameters()),
    }
    if step:
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2, foreach=False)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
        opt.step()
        ref_opt.step()
        out["params"] = _worst(_max_diff(p, ref.get_parameter(_clean(k)))
                               for k, p in net.named_parameters())
        out["bytes"] = state_bytes(net, opt)
        out["ref_bytes"] = state_bytes(ref, ref_opt)
    return out


def _refusals(mesh: Any) -> dict[str, str]:
    """DDP on tensor-parallel parameters, and a sequence tp does not divide under SP."""
    found = {}
    net = parallelize(TransformerLM(SHAPES["llama"], DTYPE, seed=SEED), mesh, tp=2, sp=True)
    try:
        apply_ddp(net, mesh["tp"])
    except SpecError as e:
        found["ddp"] = str(e)
    ids = torch.zeros(1, SEQ - 1, dtype=torch.int64)
    try:
        net(ids)
    except SpecError as e:
        found["seq"] = str(e)
    return found


def run_cases(ctx: Any, mesh_shape: tuple[int, int], cases: list[dict[str, Any]],
              refusals: bool = False) -> dict[str, Any]:
    """Every case on one ("dp", "tp") mesh; the refusals last (they leave no collectives)."""
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "tp"))
    results = [_case(mesh, **case) for case in cases]
    return {"results": results, "refusals": _refusals(mesh) if refusals else {}}


def run_meshes(ctx: Any, runs: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Several ``run_cases`` one after another in the same ranks (one start-up)."""
    return [run_cases(ctx, *run) for run in runs]


# --- fixtures ------------------------------------------------------------------------------

def _cases_module(folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module in ``folder`` that loads this file, so spawned workers can import its
    functions."""
    name = f"parallelize_cases_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(
        "import importlib.util\n"
        f"_spec = importlib.util.spec_from_file_location({name + '_impl'!r}, {__file__!r})\n"
        "_mod = importlib.util.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(_mod)\n"
        "run_cases = _mod.run_cases\n"
        "run_meshes = _mod.run_meshes\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder),
                                                     os.environ.get("PYTHONPATH", "")]))
    assert importlib.util.find_spec(name) is not None
    return name


@pytest.fixture
def cases_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return _cases_module(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The tensor-parallel (mesh 1 x 2) and data-parallel (2 x 1) cases, each rank's results
    by mesh, from one launch of two ranks."""
    folder = tmp_path_factory.mktemp("parallelize")
    with pytest.MonkeyPatch.context() as mp:
        module = _cases_module(folder, mp)
        out = launch(f"{module}:run_meshes", 2, ([((1, 2), TP_CASES, True),
                                                  ((2, 1), DP_CASES)],),
                     timeout_s=120, log_dir=str(folder / "logs"))
    return {"tp": [rank[0] for rank in out], "dp": [rank[1] for rank in out]}


def _assert_equal(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        for r in result["results"]:
            worst = {k: r[k] for k in ("logits", "loss", "grads", "params") if k in r}
            assert all(v <= r["tol"] for v in worst.values()), (rank, r["case"], worst)


# --- multi-process checks ------------------------------------------------------------------

TP_CASES: list[dict[str, Any]] = [
    {"model": "llama", "tp": 2, "step": True},
    {"model": "llama", "tp": 2, "sp": True, "lp": True, "ac": "full", "step": True},
    {"model": "llama", "tp": 2, "sp": True, "ac": "selective"},
    {"model": "gpt-tied", "tp": 2, "step": True},
    {"model": "gpt-tied", "tp": 2, "sp": True, "ac": "full"},
    {"model": "gpt-untied", "tp": 2, "sp": True, "lp": True},
    {"model": "qwen3", "tp": 2, "step": True},
    {"model": "qwen3", "tp": 2, "sp": True, "lp": True, "ac": "selective", "step": True},
]


def test_tensor_parallel_equals_one_process(two_ranks: dict[str, Any]) -> None:
    out = two_ranks["tp"]
    _assert_equal(out)
    for result in out:
        by_case = {r["case"]: r for r in result["results"]}
        assert len(by_case) == len(TP_CASES)
        for r in by_case.values():
            assert r["dtensor_params"] > 0
            assert r["logits_dtensor"] == (" lp=True" in r["case"])
        for r in (by_case["llama tp2 dp1 fsdp sp=False lp=False ac=none"],
                  by_case["llama tp2 dp1 fsdp sp=True lp=True ac=full"]):
            assert r["bytes"]["params"] < r["ref_bytes"]["params"]  # sharded, not replicated
            # Gradients are placed as their parameters (the embedding's is not left
            # Replicate), and AdamW's moments follow the local shards.
            assert r["bytes"]["grads"] == r["bytes"]["params"]
            assert r["bytes"]["optimizer"] == 2 * r["bytes"]["params"]
        assert "ddp" in result["refusals"]["ddp"] and "fsdp" in result["refusals"]["ddp"]
        assert result["refusals"]["seq"].startswith("seq=15")


DP_CASES: list[dict[str, Any]] = [
    {"model": "llama", "dp": 2, "dp_mode": "fsdp", "step": True},
    {"model": "llama", "dp": 2, "dp_mode": "fsdp-zero2", "ac": "full"},
    {"model": "llama", "dp": 2, "dp_mode": "ddp", "ac": "selective", "step": True},
    {"model": "gpt-tied", "dp": 2, "dp_mode": "fsdp", "ac": "full", "step": True},
    {"model": "gpt-tied", "dp": 2, "dp_mode": "ddp", "ac": "full"},
    {"model": "llama", "dp": 2, "dp_mode": "fsdp", "bf16": True},
    {"model": "qwen3", "dp": 2, "dp_mode": "fsdp", "ac": "full", "step": True},
]


def test_data_parallel_equals_one_process(two_ranks: dict[str, Any]) -> None:
    out = two_ranks["dp"]
    _assert_equal(out)
    fsdp = [result["results"][0] for result in out]
    ref = fsdp[0]["ref_bytes"]
    # FSDP2 shards every parameter on dim 0: the ranks' shards add up to the model,
    # and each rank's AdamW moments are twice its shard.
    assert sum(r["bytes"]["params"] for r in fsdp) == ref["params"]
    assert all(r["bytes"]["optimizer"] == 2 * r["bytes"]["params"] for r in fsdp)
    ddp = [result["results"][2] for result in out]
    assert all(r["dtensor_params"] == 0 and r["bytes"] == r["ref_bytes"] for r in ddp)


def test_fsdp_over_tensor_parallel_2x2(cases_module: str, tmp_path: Path) -> None:
    cases = [{"model": "llama", "tp": 2, "dp": 2, "sp": True, "lp": True, "ac": "full",
              "step": True},
             {"model": "gpt-tied", "tp": 2, "dp": 2, "dp_mode": "fsdp-zero2", "sp": True},
             {"model": "qwen3", "tp": 2, "dp": 2, "step": True}]
    out = launch(f"{cases_module}:run_cases", 4, ((2, 2), cases), timeout_s=180,
                 log_dir=str(tmp_path / "logs"))
    _assert_equal(out)


# --- single-process checks -----------------------------------------------------------------

def test_plans_are_declarative_and_follow_torchtitan() -> None:
    llama, tied = SHAPES["llama"], SHAPES["gpt-tied"]
    plain = block_plan(llama, sequence_parallel=False)
    assert {k: type(v) for k, v in plain.items()} == {
        "attn.q_proj": ColwiseParallel, "attn.k_proj": ColwiseParallel,
        "attn.v_proj": ColwiseParallel, "attn.o_proj": RowwiseParallel,
        "mlp.gate_proj": ColwiseParallel, "mlp.up_proj": ColwiseParallel,
        "mlp.down_proj": RowwiseParallel,
        # each module input enters replicated once: one gradient all-reduce per input
        "attn": PrepareModuleInput, "mlp": PrepareModuleInput}
    assert plain["attn"].input_layouts == (Replicate(), None, None)
    moe = block_plan(replace(llama, moe=MoE(4, 2, 64, shared_experts=1)), False, moe=True)
    assert "mlp" not in moe  # the router reads it as it is
    # the shared experts take their input once, as the dense MLP does
    assert isinstance(moe["mlp.shared"], PrepareModuleInput)
    assert moe["mlp.shared"].input_layouts == (Replicate(),)
    assert "mlp.shared" not in block_plan(replace(llama, moe=MoE(4, 2, 64)), False, moe=True)
    seq = block_plan(llama, sequence_parallel=True)
    assert isinstance(seq["attn_norm"], SequenceParallel)
    assert isinstance(seq["mlp"], PrepareModuleInput)
    assert seq["attn.o_proj"].output_layouts == (Shard(1),)
    assert "mlp.gate_proj" not in block_plan(tied, False)  # GELU MLP: up and down only
    full = tp_plan(llama, sequence_parallel=True, loss_parallel=True)
    assert full["embed"].output_layouts == (Shard(1),)
    assert full["lm_head"].output_layouts == (Shard(-1),)
    assert not full["lm_head"].use_local_output
    assert "blocks.*.attn.q_proj" in full and "blocks.0" not in full
    # Tied: embedding and head stay replicated; the sequence is scattered at blocks.0.
    tied_plan = root_plan(tied, sequence_parallel=True, loss_parallel=False)
    assert set(tied_plan) == {"blocks.0", "final_norm"}
    assert root_plan(tied, sequence_parallel=False, loss_parallel=False) == {}
    # Learned positions (gpt, untied): the embedding all-reduces, blocks.0 scatters.
    gpt_plan = root_plan(SHAPES["gpt-untied"], sequence_parallel=True, loss_parallel=True)
    assert gpt_plan["embed"].output_layouts == (Replicate(),) and "blocks.0" in gpt_plan
    with pytest.raises(SpecError, match="loss_parallel"):
        tp_plan(tied, sequence_parallel=False, loss_parallel=True)


def test_refusals_before_any_collective() -> None:
    model = TransformerLM(SHAPES["llama"], DTYPE)
    for kwargs, field in [({"tp": 1, "sp": True}, "sp"), ({"dp_mode": "zero3"}, "dp_mode"),
                          ({"ac": "some"}, "ac"), ({"tp": 2, "dp": 2, "dp_mode": "ddp"},
                                                   "dp_mode"),
                          ({"dp": 2, "dp_mode": "ddp", "param_dtype": torch.bfloat16},
                           "param_dtype")]:
        with pytest.raises(SpecError) as e:
            parallelize(model, None, **kwargs)
        assert e.value.field == field
    with pytest.raises(SpecError, match="kv_heads"):
        check_tp(SHAPES["llama"], 4)  # 2 kv heads cannot split 4 ways
    with pytest.raises(SpecError, match="vocab"):
        check_tp(ModelShape("odd", 1, 32, 4, 155, 8, style="llama", tied=False), 2)
    check_tp(ModelShape("odd-tied", 1, 32, 4, 155, 8, style="gpt", tied=True), 2)


@pytest.mark.parametrize("mode", ["full", "selective", "op"])
def test_activation_checkpointing_keeps_gradients(mode: str) -> None:
    batch = the_batch()

    def grads(model: nn.Module) -> dict[str, torch.Tensor]:
        logits = model(batch.input_ids, batch.pad_mask)
        lm_loss_sum(logits, batch.targets, batch.loss_mask).backward()
        return {_clean(k): p.grad for k, p in model.named_parameters()}

    ref = grads(TransformerLM(SHAPES["llama"], DTYPE, seed=SEED))
    model = apply_ac(TransformerLM(SHAPES["llama"], DTYPE, seed=SEED), mode)
    wrapped = [isinstance(b, CheckpointWrapper) for b in model.blocks]
    assert wrapped == [mode in ("full", "op")] * len(model.blocks)
    if mode == "selective":
        assert all(b.attn.recompute_core for b in model.blocks)
    got = grads(model)
    assert got.keys() == ref.keys()
    assert _worst(float((got[k] - ref[k]).abs().max()) for k in ref) <= TOL


def test_state_bytes_counts_each_tensor_once() -> None:
    model = TransformerLM(SHAPES["gpt-tied"], DTYPE)  # lm_head.weight is embed.weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert state_bytes(model, opt) == {"params": 0, "grads": 0, "optimizer": 0, "total": 0} \
        | {"params": sum(p.numel() for p in model.parameters()) * 8,
           "total": sum(p.numel() for p in model.parameters()) * 8}
    batch = the_batch()
    lm_loss_sum(model(batch.input_ids), batch.targets, batch.loss_mask).backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters()) * 8
    assert state_bytes(model, opt) == {"params": n, "grads": n, "optimizer": 2 * n,
                                       "total": 4 * n}
