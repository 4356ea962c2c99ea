"""Checkpoints: resumed runs bitwise equal to uninterrupted ones (FSDP, DDP, TP, PP with a
tied head, interleaved PP, expert parallel, context parallel, uneven pipeline stages, and
dp2 x tp2 x pp2; the uninterrupted runs save in the background, the default, the resumed
ones synchronously), resharded loads within a stated tolerance (experts, context parallel
and uneven stages too), a SIGKILL in the middle of a save, the safe metadata reader,
checksums and the manifest. One-process storage tests: test_checkpoint_storage.py.

One launch of two ranks runs every two-rank training in sequence (``run_cases``), so
the spawn cost is paid once (the run killed in the middle of a save has a launch of its
own before it; its resumed run joins the shared one); the files are compared afterwards
in this process, with no process group (DCP reshards to one process).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardlab.config.model import ModelShape, MoE
from shardlab.distributed import checkpoint_manifest, rng
from shardlab.distributed.checkpoint import load_model_state
from shardlab.distributed.checkpoint_reader import safe_reader
from shardlab.distributed.launch import LaunchError, launch
from shardlab.errors import SpecError
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.train.config import TrainConfig
from shardlab.train.loop import train_rank

DOCS = garden_documents(200, 0)
LLAMA = ModelShape("tiny-llama", 2, 32, 4, garden_vocab().size, 32, kv_heads=2,
                   style="llama", tied=False)
GPT = ModelShape("tiny-gpt", 2, 32, 4, garden_vocab().size, 32, style="gpt", tied=True)
LLAMA4 = replace(LLAMA, name="tiny-llama-4", layers=4)  # one layer per virtual stage
# A mixture of experts: 8 experts, top-2, a shared expert, a dense first layer.
MOE = replace(LLAMA, name="tiny-moe", layers=3,
              moe=MoE(8, 2, 32, shared_experts=1, dense_layers=1))
STEPS, EVERY = 4, 2
# A different layout adds the same numbers in another order: the loss may move in the
# last bits, never more than the parity tolerance of `shardlab train --check-parity`.
RESHARD_RTOL = 1e-5


def config(root: Path, name: str, shape: ModelShape = LLAMA, **kw: Any) -> TrainConfig:
    return TrainConfig(shape=shape, steps=STEPS, checkpoint_every=EVERY,
                       checkpoint_dir=str(root / name), docs=DOCS,
                       data_id=checkpoint_manifest.data_fingerprint(DOCS), **kw)


def run_cases(ctx: Any, runs: list[TrainConfig]) -> list[dict[str, Any]]:
    """Every run in order on this rank (the same process group)."""
    out = []
    for cfg in runs:
        r = train_rank(ctx, cfg)
        out.append({"losses": r["losses"], "resumed_at": r["resumed_at"]})
    return out


LAYOUTS = {  # name: (shape, layout); every one on two ranks
    "fsdp": (LLAMA, {"dp": 2}),
    "ddp": (LLAMA, {"dp": 2, "dp_mode": "ddp", "micro_batch": 2}),
    "tp": (LLAMA, {"tp": 2, "sp": True}),
    # A tied head: two copies on two stages (clipping counts the tied weight once).
    "pp": (GPT, {"pp": 2, "micro_batch": 2}),
    # Two virtual stages per rank (interleaved 1F1B): each rank saves both its stages.
    "pp-interleaved": (LLAMA4, {"pp": 2, "virtual_stages": 2, "schedule": "interleaved-1f1b",
                                "micro_batch": 2}),
    # Experts split over two expert-parallel ranks (DTensor shards of the whole [E, ...]).
    "moe-ep": (MOE, {"dp": 2, "ep": 2}),
    # Experts split over tp (etp = tp): DTensors over the (ep, tp) dims.
    "moe-etp": (MOE, {"tp": 2, "etp": 2}),
    # Context parallel: the sequence over two ranks, FSDP over the cp ranks (issue 17).
    "cp": (LLAMA, {"cp": 2}),
    # Uneven pipeline stages: three layers on the first rank, one on the second.
    "pp-uneven": (LLAMA4, {"pp": 2, "micro_batch": 2, "stage_layers": (3, 1)}),
}
RESHARDS = {  # name: (from, layout it resumes in)
    "fsdp->tp": ("fsdp", {"tp": 2}),
    "fsdp->ddp": ("fsdp", {"dp": 2, "dp_mode": "ddp"}),
    "pp->dp": ("pp", {"dp": 2}),
    # The same token groups per forward (dp = 2), the experts now FSDP-sharded over dp.
    "moe-ep->dp": ("moe-ep", {"dp": 2}),
    "moe-etp->tp": ("moe-etp", {"tp": 2}),  # the experts whole on both ranks again
    "cp->dp": ("cp", {"dp": 2}),  # the same model, now each rank a whole sequence
    "pp-uneven->even": ("pp-uneven", {"pp": 2, "micro_batch": 2}),  # 2 + 2 layers
}


def _helper_module(folder: Path) -> str:
    name = f"ckpt_ranks_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(
        "import importlib.util\n"
        f"_spec = importlib.util.spec_from_file_location('_ckpt_test', {str(Path(__file__))!r})\n"
        "_mod = importlib.util.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(_mod)\n"
        "run_cases = _mod.run_cases\n")
    return name


def _killed_in_save(root: Path) -> tuple[dict[str, Any], TrainConfig]:
    """FSDP on two ranks, rank 1 SIGKILLed inside the save of step 4 (after writing its
    shards, before the rename): what the launch raised and took, the children left, and
    the folder as the kill left it; and the run that resumes it (in the shared launch)."""
    shape, layout = LAYOUTS["fsdp"]
    cfg = replace(config(root, "killed", shape, **layout), fail_at_step=4, fail_rank=1,
                  fail_how="kill-in-save", async_save=False)
    start = time.monotonic()
    error = None
    try:
        launch("shardlab.train.loop:train_rank", 2, (cfg,), timeout_s=20,
               log_dir=str(root / "logs-killed"))
    except LaunchError as e:
        error = e
    folder = root / "killed"
    seen = {"error": error, "seconds": time.monotonic() - start,
            "children": _live_children(), "tmp_left": (folder / "step-4.tmp").is_dir(),
            "complete": sorted(checkpoint_manifest.complete_steps(folder)),
            "found": checkpoint_manifest.find(folder)}
    return seen, replace(cfg, fail_at_step=-1, resume_from=str(folder / "step-2"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every two-rank run in one launch, after the run killed in the middle of a save
    (whose resumed run joins the launch)."""
    root = tmp_path_factory.mktemp("ckpt")
    killed, killed_resumed = _killed_in_save(root)
    plan: list[tuple[str, TrainConfig]] = [("killed-resumed", killed_resumed)]
    for name, (shape, layout) in LAYOUTS.items():
        first = config(root, name, shape, **layout)
        plan.append((name, first))
        # resumed from the uninterrupted run's step 2 into a folder of its own; the
        # uninterrupted runs save in the background (the default), the resumed ones not
        resumed = replace(first, checkpoint_dir=str(root / f"{name}-resumed"),
                          resume_from=str(root / name / "step-2"), async_save=False)
        plan.append((f"{name}-resumed", resumed))
    for name, (source, layout) in RESHARDS.items():
        shape = LAYOUTS[source][0]
        cfg = config(root, name, shape, **layout)
        plan.append((name, replace(cfg, resume_from=str(root / source / "step-2"))))
    module = _helper_module(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))  # spawned workers get the parent's sys.path
        mp.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
        out = launch(f"{module}:run_cases", 2, ([cfg for _, cfg in plan],), timeout_s=120,
                     log_dir=str(root / "logs"))
    return {"root": root, "results": {name: out[0][i] for i, (name, _) in enumerate(plan)},
            "killed": killed}


def final_params(folder: Path, shape: ModelShape) -> dict[str, torch.Tensor]:
    return load_model_state(folder, shape)


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_resumed_run_is_bitwise_the_uninterrupted_one(runs: dict[str, Any], name: str) -> None:
    root, results = runs["root"], runs["results"]
    shape = LAYOUTS[name][0]
    assert results[f"{name}-resumed"]["resumed_at"] == 2
    # fp32 on CPU, same layout: the same bits (exact float equality of every loss)
    assert results[f"{name}-resumed"]["losses"] == results[name]["losses"]
    a = final_params(root / name / "step-4", shape)
    b = final_params(root / f"{name}-resumed" / "step-4", shape)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), name
    doc = checkpoint_manifest.verify(root / f"{name}-resumed" / "step-4")
    assert doc["step"] == 4 and doc["data"]["batches_consumed"] == 4
    assert doc["world_size"] == 2 and doc["torch"] == torch.__version__


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(RESHARDS))
def test_resharded_resume_within_tolerance(runs: dict[str, Any], name: str) -> None:
    root, results = runs["root"], runs["results"]
    source = RESHARDS[name][0]
    want, got = results[source]["losses"], results[name]["losses"]
    assert got[:2] == want[:2]  # the history travels in the manifest
    for a, b in zip(got[2:], want[2:], strict=True):
        assert abs(a - b) <= RESHARD_RTOL * abs(b), (name, got, want)
    shape = LAYOUTS[source][0]
    torch.testing.assert_close(final_params(root / name / "step-4", shape),
                               final_params(root / source / "step-4", shape),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.multiprocess
def test_keeps_the_last_checkpoints_and_records_the_run(runs: dict[str, Any]) -> None:
    root = runs["root"]
    assert sorted(checkpoint_manifest.complete_steps(root / "fsdp")) == [2, 4]
    doc = checkpoint_manifest.read_manifest(root / "tp" / "step-4")
    assert doc["layout"]["tp"] == 2 and doc["shape"]["kv_heads"] == 2
    assert len(doc["history"]["losses"]) == 4 and doc["scheduler"]["last_epoch"] == 4
    assert doc["optimizer"]["betas"] == [0.9, 0.95]
    assert set(doc["files"]) >= {".metadata", "__0_0.distcp", "__1_0.distcp",
                                 "rng/rank-0.json", "rng/rank-1.json"}
    for name in LAYOUTS:  # saved in the background: the last one whole when the run ended
        assert not list((root / name).glob("*.tmp")), name
        assert checkpoint_manifest.verify(root / name / "step-4")["step"] == 4, name


@pytest.mark.multiprocess
def test_sigkill_in_the_middle_of_a_save(runs: dict[str, Any]) -> None:
    """Rank 1 is SIGKILLed after writing its shards of step 4, before the rename: the job
    ends naming it, step-4.tmp is left and ignored, step 2 loads, and the resumed run
    ends bitwise equal to the uninterrupted one."""
    killed, folder = runs["killed"], runs["root"] / "killed"
    assert isinstance(killed["error"], LaunchError), killed["error"]
    assert killed["seconds"] < 30
    assert killed["error"].rank == 1 and "SIGKILL" in killed["error"].error
    assert not killed["children"]
    assert killed["tmp_left"] and killed["complete"] == [2]
    assert killed["found"] == folder / "step-2"
    resumed = runs["results"]["killed-resumed"]
    assert resumed["resumed_at"] == 2 and resumed["losses"] == runs["results"]["fsdp"]["losses"]
    assert not (folder / "step-4.tmp").exists()
    shape = LAYOUTS["fsdp"][0]
    a = final_params(runs["root"] / "fsdp" / "step-4", shape)
    b = final_params(folder / "step-4", shape)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _live_children(parent: int | None = None) -> list[int]:
    """This process's children that are still running (not zombies), the ranks among the
    fork server's children in its place."""
    pids = []
    for task in Path(f"/proc/{parent or os.getpid()}/task").iterdir():
        pids += [int(p) for p in (task / "children").read_text().split()]
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if state == "Z" or "resource_tracker" in cmd:
            continue  # multiprocessing's resource tracker lives as long as its parent
        if "multiprocessing.forkserver" in cmd and parent is None:
            alive += _live_children(pid)  # the launcher's ranks are forked from it
        else:
            alive.append(pid)
    return alive


# --- bad checkpoints (no process) ---------------------------------------------------------

def _copy(runs: dict[str, Any], tmp_path: Path, name: str = "fsdp") -> Path:
    target = tmp_path / "copy"
    shutil.copytree(runs["root"] / name, target)
    return target


@pytest.mark.multiprocess
def test_corrupt_truncated_or_missing_files_are_named(runs: dict[str, Any],
                                                      tmp_path: Path) -> None:
    root = _copy(runs, tmp_path)
    step = root / "step-4"
    shard = step / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(SpecError, match=r"__1_0\.distcp: XXH3-64 does not match"):
        checkpoint_manifest.verify(step)
    shard.write_bytes(bytes(data[:-10]))
    with pytest.raises(SpecError, match="truncated"):
        checkpoint_manifest.verify(step)
    shard.unlink()
    with pytest.raises(SpecError, match="is missing"):
        checkpoint_manifest.verify(step)
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["step"] = 5
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecError, match="manifest checksum"):
        checkpoint_manifest.verify(step)
    with pytest.raises(SpecError, match="found 2, 4"):
        checkpoint_manifest.find(root, 3)


@pytest.mark.multiprocess
def test_another_shape_names_the_field(runs: dict[str, Any]) -> None:
    doc = checkpoint_manifest.read_manifest(runs["root"] / "fsdp" / "step-2")
    data = {"fingerprint": checkpoint_manifest.data_fingerprint(DOCS), "seed": 0, "global_batch": 8,
            "seq": 32}
    checkpoint_manifest.check_compatible(doc, LLAMA, data, "here")
    with pytest.raises(SpecError, match=r"^d_model=64: differs from the checkpoint's d_model=32"):
        checkpoint_manifest.check_compatible(doc, replace(LLAMA, d_model=64), data, "here")
    with pytest.raises(SpecError, match=r"^global_batch=16"):
        checkpoint_manifest.check_compatible(doc, LLAMA, {**data, "global_batch": 16}, "here")


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned",))


def test_metadata_is_never_unpickled_beyond_dcp_classes(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        safe_reader(tmp_path).read_metadata()


def test_rng_states_round_trip() -> None:
    state = json.loads(json.dumps(rng.capture()))
    a = (torch.rand(3), random.random(), np.random.rand(2))
    rng.restore(state)
    b = (torch.rand(3), random.random(), np.random.rand(2))
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])


@pytest.mark.multiprocess
def test_3d_resume_is_bitwise(tmp_path: Path) -> None:
    """dp2 x tp2 x pp2 (FSDP, TP with SP, 1F1B over 2 micro-batches), 3 steps, interrupted
    after step 2 and resumed: one launch of 8 ranks runs both. The resumed step's update
    uses every restored piece (weights, Adam moments and step, scheduler, data position),
    so one step after the resume is enough to show them all bitwise (8 ranks on 2 cores:
    each step here costs about a second, the start-up some 20 s)."""
    first = config(tmp_path, "3d", LLAMA, dp=2, tp=2, pp=2, sp=True, micro_batch=1,
                   global_batch=4)
    first = replace(first, steps=3)
    resumed = replace(first, checkpoint_dir=str(tmp_path / "3d-resumed"),
                      resume_from=str(tmp_path / "3d" / "step-2"))
    module = _helper_module(tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path),
                                                 os.environ.get("PYTHONPATH", "")]))
        out = launch(f"{module}:run_cases", 8, ([first, resumed],), timeout_s=300,
                     log_dir=str(tmp_path / "logs"))
    a_run, b_run = out[0]
    assert len(a_run["losses"]) == 3
    assert b_run["resumed_at"] == 2 and b_run["losses"] == a_run["losses"]
    a = final_params(tmp_path / "3d" / "step-3", LLAMA)
    b = final_params(tmp_path / "3d-resumed" / "step-3", LLAMA)
    assert a.keys() == b.keys()
    for k in a:  # fp32 on CPU, same layout: the same bits
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)
    doc = checkpoint_manifest.verify(tmp_path / "3d-resumed" / "step-3")
    assert doc["world_size"] == 8 and doc["step"] == 3
    assert {k: doc["layout"][k] for k in ("dp", "tp", "pp", "sp")} == {
        "dp": 2, "tp": 2, "pp": 2, "sp": True}
