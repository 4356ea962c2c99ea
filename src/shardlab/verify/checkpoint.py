"""Distributed checkpointing of an FSDP2 model and its AdamW state: save, load, reshard.

On every rank (``run``), after one AdamW step of :mod:`shardlab.verify.fsdp2`'s tiny LM:

1. :func:`torch.distributed.checkpoint.state_dict.get_state_dict` gives the model and
   optimizer state dicts as sharded DTensors (keys are the unsharded module's names), and
   :func:`torch.distributed.checkpoint.save` writes them to ``work_dir/ckpt``: each rank
   writes only its own shards, plus one metadata file.
2. A freshly sharded model with a *different* init seed (so a load that did nothing would
   show) and a fresh AdamW get their state dicts (``get_state_dict`` initialises the empty
   optimizer state with a zero-lr step), :func:`torch.distributed.checkpoint.load` fills
   them in place, and :func:`torch.distributed.checkpoint.state_dict.set_state_dict` puts
   them back into the model and optimizer. Parameters and the Adam moments ``exp_avg``
   and ``exp_avg_sq`` (all gathered with ``DTensor.full_tensor()``) and the step counts
   must equal the saved ones exactly (a copy, no arithmetic). One more training step on
   both must then give identical parameters: the restored state is complete.

Rank 0 also writes the full parameters and moments, plain tensors, to
``work_dir/expected.pt`` (``torch.save``). Then ``after``, in the calling process with no
process group at all:

3. The checkpoint that ``world`` ranks wrote is loaded into one plain, unsharded
   :class:`shardlab.nn.model.TransformerLM` (``dcp.load(..., no_dist=True)``): DCP reshards
   from ``world`` shards to one by the saved metadata.
4. :func:`torch.distributed.checkpoint.format_utils.dcp_to_torch_save` converts it into a
   single ``torch.save`` file, ``work_dir/consolidated.pt``.

Both must match ``expected.pt``. Every file is read back with
``torch.load(..., weights_only=True)``: nothing is unpickled beyond tensors and plain
containers.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from shardlab.distributed.launch import RankContext
from shardlab.nn.data import global_token_normalizer
from shardlab.nn.model import TransformerLM
from shardlab.verify.fsdp2 import (
    SEED,
    SHAPE,
    dp_mesh,
    force_sum_needed,
    fsdp_train,
    full_tensors,
    new_model,
    new_optimizer,
    shard,
    share_loss,
    to_device,
    training_data,
)
from shardlab.verify.registry import check

MOMENTS = ("exp_avg", "exp_avg_sq")
EXACT = 1e-7  # a checkpoint round trip copies bits: expect 0
CKPT, EXPECTED, CONSOLIDATED = "ckpt", "expected.pt", "consolidated.pt"


def max_abs_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Largest |a - b| over tensors with the same names (KeyError when names differ)."""
    if a.keys() != b.keys():
        raise KeyError(f"different tensors: {sorted(a.keys() ^ b.keys())}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def optimizer_tensors(model: torch.nn.Module, opt: torch.optim.Optimizer
                      ) -> dict[str, dict[str, torch.Tensor]]:
    """Each moment (and the step count) by parameter name, full tensors on CPU."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key in (*MOMENTS, "step"):
        out[key] = full_tensors((n, opt.state[p][key]) for n, p in model.named_parameters())
    return out


def _train_one_more(ctx: RankContext, model: torch.nn.Module,
                    opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """One more step on the second training batch; the full parameters after it."""
    batch = training_data(2)[1]
    mine = to_device(batch.chunk(ctx.rank, ctx.world_size), torch.device(ctx.device))
    share_loss(model, mine, global_token_normalizer(batch), ctx.world_size).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return full_tensors(model.named_parameters())


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """Save after one step, load into a differently initialised sharded model, compare.

    Writes ``work_dir/ckpt`` (every rank) and ``work_dir/expected.pt`` (rank 0).
    """
    device = torch.device(ctx.device)
    ckpt = str(Path(work_dir, CKPT))
    force = force_sum_needed(ctx)
    model, opt, _ = fsdp_train(ctx, training_data(1), force)
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=ckpt)

    saved = full_tensors(model.named_parameters())
    saved_opt = optimizer_tensors(model, opt)
    if ctx.rank == 0:
        torch.save({"params": saved, **{k: saved_opt[k] for k in MOMENTS}},
                   Path(work_dir, EXPECTED))

    fresh = shard(new_model(device, seed=SEED + 100), dp_mesh(ctx), force)
    fresh_opt = new_optimizer(fresh.parameters())
    before = max_abs_diff(full_tensors(fresh.named_parameters()), saved)
    fresh_model_sd, fresh_optim_sd = get_state_dict(fresh, fresh_opt)
    state = {"model": fresh_model_sd, "optim": fresh_optim_sd}
    dcp.load(state, checkpoint_id=ckpt)  # in place: each rank reads the pieces it owns
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])

    param_diff = max_abs_diff(full_tensors(fresh.named_parameters()), saved)
    loaded_opt = optimizer_tensors(fresh, fresh_opt)
    moment_diffs = {k: max_abs_diff(loaded_opt[k], saved_opt[k]) for k in MOMENTS}
    step_diff = max_abs_diff(loaded_opt["step"], saved_opt["step"])
    resumed = max_abs_diff(_train_one_more(ctx, fresh, fresh_opt),
                           _train_one_more(ctx, model, opt))
    dist.barrier()
    return [
        check("fresh_model_differs_before_load", before, float("inf"), passed=before > 1e-3,
              detail=f"max|fresh - saved| {before:.3e} before loading (init seed "
                     f"{SEED + 100} vs {SEED}): a load that did nothing would show"),
        check("params_roundtrip", param_diff, EXACT,
              detail=f"dcp.save + dcp.load + set_state_dict, world {ctx.world_size}: "
                     f"max|diff| {param_diff:.3e} over full_tensor() parameters"),
        *(check(f"{k}_roundtrip", v, EXACT, detail=f"AdamW {k}: max|diff| {v:.3e}")
          for k, v in moment_diffs.items()),
        check("step_roundtrip", step_diff, 0.0,
              detail=f"AdamW step counts (bias correction): max|diff| {step_diff:.0f}"),
        check("resumed_step_identical", resumed, EXACT,
              detail=f"one more step from the loaded and the original state: max|diff| "
                     f"{resumed:.3e}"),
    ]


def _load_plain(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True`` (tensors and plain containers only)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def after(work_dir: str) -> list[dict[str, object]]:
    """No process group: reshard the checkpoint into one plain model, and consolidate it.

    Writes ``work_dir/consolidated.pt``.
    """
    ckpt = Path(work_dir, CKPT)
    expected = _load_plain(Path(work_dir, EXPECTED))
    plain = TransformerLM(SHAPE, seed=SEED + 200)
    before = max_abs_diff(full_tensors(plain.named_parameters()), expected["params"])
    state = {"model": plain.state_dict()}
    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(ckpt), no_dist=True)
    plain.load_state_dict(state["model"])
    reshard = max_abs_diff(full_tensors(plain.named_parameters()), expected["params"])

    consolidated = Path(work_dir, CONSOLIDATED)
    dcp_to_torch_save(ckpt, consolidated)
    flat = _load_plain(consolidated)
    model_diff = max_abs_diff(flat["model"], expected["params"])
    opt_state = flat["optim"]["state"]
    moment_diff = max(max_abs_diff({n: opt_state[n][k] for n in expected[k]}, expected[k])
                      for k in MOMENTS)
    return [
        check("plain_model_differs_before_load", before, float("inf"), passed=before > 1e-3,
              detail=f"max|plain - saved| {before:.3e} before loading"),
        check("reshard_to_one_process", reshard, EXACT,
              detail=f"dcp.load(no_dist=True) into one unsharded TransformerLM: max|diff| "
                     f"{reshard:.3e}"),
        check("dcp_to_torch_save_model", model_diff, EXACT,
              detail=f"{CONSOLIDATED} read with weights_only=True, top keys "
                     f"{sorted(flat)}: model max|diff| {model_diff:.3e}"),
        check("dcp_to_torch_save_moments", moment_diff, EXACT,
              detail=f"optim state exp_avg/exp_avg_sq by parameter name: max|diff| "
                     f"{moment_diff:.3e}"),
    ]
