"""Pipeline stages cut from a TransformerLM: same names, same logits, same training step.

Single-process tests chain every simulated rank's stages by hand; the multiprocess tests
run two training steps of every schedule (gpipe, 1f1b, interleaved-1f1b, zb-v, dualpipev)
on two gloo ranks, in one launch, against one process on the whole batch (float64).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from shardlab.config.model import ModelShape
from shardlab.distributed.launch import launch
from shardlab.distributed.pipeline import (
    IGNORE_INDEX,
    StageModule,
    build_schedule,
    layer_split,
    make_loss_fn,
    masked_targets,
    pipeline_stages,
    pipeline_step,
    split_model,
)
from shardlab.distributed.tied_embedding import sync_tied_grads
from shardlab.errors import SpecError
from shardlab.nn.data import Batch, global_token_normalizer, make_batch
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import TransformerLM

DTYPE = torch.float64
TOLERANCE = 1e-10
STYLES = ("gpt", "llama")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-v", "dualpipev")
LAYOUTS = [(1, 1, "loop"), (2, 1, "loop"), (4, 1, "loop"), (2, 2, "loop"), (2, 2, "v"),
           (5, 1, "loop")]


def tiny_shape(style: str, layers: int = 5) -> ModelShape:
    """GQA, 5 layers (uneven over 2 and 4 stages); gpt style tied, llama style untied."""
    return ModelShape("pp", layers, 16, 4, 32, 16, kv_heads=2, style=style,
                      tied=style == "gpt")


def tiny_batch() -> Batch:
    """8 documents of different lengths (several padded) as a seq-8 batch."""
    gen = torch.Generator().manual_seed(5)
    docs = [torch.randint(3, 32, (n,), generator=gen).tolist() for n in (9, 3, 7, 5, 9, 2, 6, 8)]
    return make_batch(docs, 8)


def all_stages(model: TransformerLM, pp: int, v: int, style: str) -> list[StageModule]:
    """Every simulated rank's stages, in stage order."""
    owned = [pair for rank in range(pp) for pair in split_model(model, pp, v, style, rank=rank)]
    assert sorted(s for s, _ in owned) == list(range(pp * v))
    return [m for _, m in sorted(owned, key=lambda pair: pair[0])]


def chain(stages: list[StageModule], batch: Batch) -> torch.Tensor:
    out: Any = (batch.input_ids, batch.pad_mask)
    for stage in stages:
        out = stage(*out)
    return out


# --- single process --------------------------------------------------------------------

@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize(("pp", "v", "placement"), LAYOUTS)
def test_chained_stages_reproduce_the_full_models_logits(style: str, pp: int, v: int,
                                                         placement: str) -> None:
    model = TransformerLM(tiny_shape(style), DTYPE, seed=3)
    batch = tiny_batch()
    stages = all_stages(model, pp, v, placement)
    with torch.no_grad():
        assert torch.equal(chain(stages, batch), model(batch.input_ids, batch.pad_mask))


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize(("pp", "v", "placement"), LAYOUTS)
def test_stages_keep_the_full_models_names_and_values(style: str, pp: int, v: int,
                                                      placement: str) -> None:
    model = TransformerLM(tiny_shape(style), DTYPE, seed=3)
    full = dict(model.named_parameters(remove_duplicate=False))
    stages = all_stages(model, pp, v, placement)
    seen: list[str] = []
    for stage in stages:
        for name, p in stage.named_parameters(remove_duplicate=False):
            assert torch.equal(p, full[name]), name
            seen.append(name)
        assert list(stage.blocks.keys()) == [str(i) for i in stage.layer_ids]
        assert (stage.embed is not None) == stage.is_first
        assert (stage.lm_head is not None) == (stage.final_norm is not None) == stage.is_last
    assert sorted(seen) == sorted(full)  # every parameter on exactly one stage, same name
    assert "blocks.3.attn.q_proj.weight" in seen


def test_layers_split_evenly_and_stages_are_placed_in_a_loop_or_a_v() -> None:
    assert [len(r) for r in layer_split(5, 2)] == [3, 2]
    assert [len(r) for r in layer_split(7, 4)] == [2, 2, 2, 1]
    assert [list(r) for r in layer_split(4, 4)] == [[0], [1], [2], [3]]
    model = TransformerLM(tiny_shape("llama", layers=8), DTYPE)
    assert [s for s, _ in split_model(model, 2, 2, rank=1)] == [1, 3]
    assert [s for s, _ in split_model(model, 2, 2, "v", rank=0)] == [0, 3]
    assert [s for s, _ in split_model(model, 2, 2, "v", rank=1)] == [1, 2]
    assert [m.layer_ids for _, m in split_model(model, 4, 1, rank=2)] == [(4, 5)]


def test_a_tied_head_stays_tied_on_one_stage_and_is_copied_across_stages() -> None:
    model = TransformerLM(tiny_shape("gpt"), DTYPE)
    [(_, whole)] = split_model(model, 1, rank=0)
    assert whole.lm_head is not None and whole.embed is not None
    assert whole.lm_head.weight is whole.embed.weight and not whole.holds_tied_copy
    first, last = all_stages(model, 2, 1, "loop")
    assert first.holds_tied_copy and last.holds_tied_copy
    assert last.tied_weight() is not first.tied_weight()
    assert torch.equal(last.tied_weight(), first.tied_weight())
    untied = all_stages(TransformerLM(tiny_shape("llama"), DTYPE), 2, 1, "loop")
    assert not any(s.holds_tied_copy for s in untied)


@pytest.mark.parametrize("placement", ["loop", "v"])
def test_sync_tied_grads_gives_both_copies_the_tied_gradient(placement: str) -> None:
    model = TransformerLM(tiny_shape("gpt"), DTYPE, seed=4)
    batch = tiny_batch()
    n = global_token_normalizer(batch)
    lm_loss_sum(model(batch.input_ids, batch.pad_mask), batch.targets,
                batch.loss_mask).div(n).backward()
    stages = all_stages(model, 2, 2 if placement == "v" else 1, placement)
    make_loss_fn(n)(chain(stages, batch), masked_targets(batch)).backward()
    first, last = stages[0].tied_weight(), stages[-1].tied_weight()
    assert first.grad is not None and last.grad is not None
    tied = model.embed.weight.grad
    assert (first.grad - tied).abs().max() > 1e-6  # each copy holds only its part
    sync_tied_grads(stages)  # simulated ranks: both copies in one list, summed locally
    assert torch.equal(first.grad, last.grad)
    assert_close(first.grad, tied, rtol=0, atol=1e-12)
    full = dict(model.named_parameters(remove_duplicate=False))
    for stage in stages:
        for name, p in stage.named_parameters():
            assert p.grad is not None
            assert_close(p.grad, full[name].grad, rtol=0, atol=1e-12, msg=name)


def test_micro_batch_losses_sum_to_the_global_token_mean() -> None:
    model = TransformerLM(tiny_shape("llama"), DTYPE, seed=2)
    batch = tiny_batch()
    n = global_token_normalizer(batch)
    targets = masked_targets(batch)
    assert torch.equal(targets == IGNORE_INDEX, batch.loss_mask == 0)
    loss_fn = make_loss_fn(n)
    with torch.no_grad():
        whole = lm_loss_sum(model(batch.input_ids, batch.pad_mask), batch.targets,
                            batch.loss_mask) / n
        parts = [loss_fn(model(b.input_ids, b.pad_mask), masked_targets(b))
                 for b in batch.split(4)]
    assert abs(float(sum(parts)) - float(whole)) < 1e-14


def _stub(stage_index: int, num_stages: int, rank: int = 0, pp: int = 2) -> Any:
    return SimpleNamespace(stage_index=stage_index, num_stages=num_stages, group_rank=rank,
                           group_size=pp)


def test_bad_splits_and_schedules_raise_spec_error() -> None:
    model = TransformerLM(tiny_shape("llama", layers=3), DTYPE)
    for kwargs in ({"pp": 4, "rank": 0},  # 4 stages for 3 layers
                   {"pp": 2, "virtual_stages": 2, "rank": 0},
                   {"pp": 2, "style": "zigzag", "rank": 0},
                   {"pp": 1, "virtual_stages": 3, "style": "v", "rank": 0},
                   {"pp": 2, "rank": 2}, {"pp": 2, "rank": True}, {"pp": 0, "rank": 0},
                   {"pp": 2}):
        with pytest.raises(SpecError):
            split_model(model, **kwargs)  # the last: no rank and no process group
    with pytest.raises(SpecError):
        make_loss_fn(0)
    loss_fn = make_loss_fn(1)
    bad = [("pipedream", [_stub(0, 2)], 4),
           ("gpipe", [_stub(0, 4), _stub(2, 4)], 4),  # two stages per rank
           ("1f1b", [_stub(0, 2)], 1),  # fewer micro-batches than stages
           ("interleaved-1f1b", [_stub(0, 2)], 4),  # one stage per rank
           ("interleaved-1f1b", [_stub(0, 4), _stub(2, 4)], 3),  # 3 % pp != 0
           ("zb-v", [_stub(0, 4), _stub(2, 4)], 4),  # loop placement, not a V
           ("dualpipev", [_stub(0, 4), _stub(3, 4)], 2),  # fewer micro-batches than stages
           ("gpipe", [_stub(1, 2)], 4)]  # rank 0 does not hold stage 1
    for name, stages, n_micro in bad:
        with pytest.raises(SpecError):
            build_schedule(name, stages, n_micro, loss_fn)


# --- two processes ---------------------------------------------------------------------
# The ranks' function lives in this file; workers load it through a shim module that
# the launcher can import by name (see tests/distributed/test_launch.py).

STEPS, N_MICRO, LR = 2, 4, 0.5


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def _run_case(ctx: Any, style: str, name: str) -> dict[str, Any]:
    """STEPS steps of SGD through schedule ``name`` and through the whole model."""
    shape, batch = tiny_shape(style), tiny_batch()
    n = global_token_normalizer(batch)
    ref = TransformerLM(shape, DTYPE, seed=1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    v, placement = (1, "loop") if name in ("gpipe", "1f1b") else (
        2, "v" if name in ("zb-v", "dualpipev") else "loop")
    owned = split_model(TransformerLM(shape, DTYPE, seed=1), ctx.world_size, v, placement)
    modules = [m for _, m in owned]
    opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=LR)
    schedule = build_schedule(name, pipeline_stages(owned, ctx.device), N_MICRO,
                              make_loss_fn(n))
    is_first, is_last = any(m.is_first for m in modules), any(m.is_last for m in modules)
    out: dict[str, Any] = {"rank": ctx.rank, "losses": [], "ref_losses": [], "grad_diff": 0.0,
                           "param_diff": 0.0, "pre_sync_diff": None, "tied": {},
                           "names": sorted(k for m in modules for k, _ in m.named_parameters())}
    full = dict(ref.named_parameters(remove_duplicate=False))
    for step in range(STEPS):
        ref_opt.zero_grad()
        ref_loss = lm_loss_sum(ref(batch.input_ids, batch.pad_mask), batch.targets,
                               batch.loss_mask) / n
        ref_loss.backward()
        out["ref_losses"].append(ref_loss.item())
        opt.zero_grad()
        loss = pipeline_step(schedule, batch, is_first, is_last)
        out["losses"].append(None if loss is None else float(loss))
        if step == 0 and any(m.holds_tied_copy for m in modules):
            out["pre_sync_diff"] = max(float((m.tied_weight().grad - full["embed.weight"].grad)
                                             .abs().max()) for m in modules if m.holds_tied_copy)
        sync_tied_grads(modules)
        for m in modules:
            for k, p in m.named_parameters():
                diff = float("inf") if p.grad is None else float((p.grad - full[k].grad)
                                                                 .abs().max())
                out["grad_diff"] = max(out["grad_diff"], diff)
        ref_opt.step()
        opt.step()
        for m in modules:
            for k, p in m.named_parameters():
                out["param_diff"] = max(out["param_diff"], float((p - full[k]).abs().max()))
    out["tied"] = {"first" if m.is_first else "last": _digest(m.tied_weight())
                   for m in modules if m.holds_tied_copy}
    if name == "interleaved-1f1b":  # a precondition checked on real PipelineStages
        try:
            build_schedule(name, pipeline_stages(owned, ctx.device), 3, make_loss_fn(n))
        except SpecError as e:
            out["spec_error"] = str(e)
    return out


def run_cases(ctx: Any, cases: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """Every (style, schedule) case on this rank, keyed ``style/schedule``."""
    return {f"{style}/{name}": _run_case(ctx, style, name) for style, name in cases}


CASES = [(style, name) for style in STYLES for name in SCHEDULES]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("pp")
    name = f"pp_ranks_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(
        "import importlib.util\n"
        f"_spec = importlib.util.spec_from_file_location('_pp_test', {str(Path(__file__))!r})\n"
        "_mod = importlib.util.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(_mod)\n"
        "run_cases = _mod.run_cases\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))  # spawned workers get the parent's sys.path
        mp.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
        return launch(f"{name}:run_cases", 2, (CASES,), timeout_s=120,
                      log_dir=str(folder / "logs"))


@pytest.mark.multiprocess
@pytest.mark.parametrize(("style", "name"), CASES)
def test_a_pipeline_step_equals_one_process(results: list[dict[str, dict[str, Any]]],
                                            style: str, name: str) -> None:
    ranks = [r[f"{style}/{name}"] for r in results]
    full = TransformerLM(tiny_shape(style), DTYPE)
    # every parameter of the model was on some stage, and its gradient was compared
    assert sorted(k for r in ranks for k in r["names"]) == sorted(
        k for k, _ in full.named_parameters(remove_duplicate=False))
    last = [r for r in ranks if r["losses"][0] is not None]
    assert len(last) == 1  # one rank holds the last stage (rank 1 in a loop, 0 in a V)
    assert last[0]["rank"] == (0 if name in ("zb-v", "dualpipev") else 1)
    for got, want in zip(last[0]["losses"], last[0]["ref_losses"], strict=True):
        assert abs(got - want) <= TOLERANCE
    assert last[0]["losses"][1] < last[0]["losses"][0]  # the SGD step trained
    assert max(r["grad_diff"] for r in ranks) <= TOLERANCE
    assert max(r["param_diff"] for r in ranks) <= TOLERANCE
    if style == "gpt":  # tied head: the sync mattered, and the two copies stay identical
        assert max(r["pre_sync_diff"] for r in ranks if r["pre_sync_diff"] is not None) > 1e-6
        tied = {k: v for r in ranks for k, v in r["tied"].items()}
        assert set(tied) == {"first", "last"} and tied["first"] == tied["last"]
    if name == "interleaved-1f1b":
        assert all("multiple of pp" in r.get("spec_error", "") for r in ranks)
