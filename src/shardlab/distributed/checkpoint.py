"""Training checkpoints that survive crashes, resume exactly and reshard on load.

A checkpoint is a folder ``ROOT/step-N`` (N = optimizer steps done) holding:

* the model and AdamW state as a ``torch.distributed.checkpoint`` (DCP) save: one
  ``__R_0.distcp`` file of tensor shards per rank and DCP's ``.metadata``. The state
  dicts come from ``get_state_dict`` with ``flatten_optimizer_state_dict=True``, so
  every tensor is keyed by the unsharded model's parameter name (``model.blocks.3.attn.
  q_proj.weight``, ``optim.state.blocks.3.attn.q_proj.weight.exp_avg``) whatever the
  layout: FSDP2 and tensor-parallel DTensor shards, DDP replicas and pipeline stages
  (which keep the full model's names, :mod:`shardlab.distributed.pipeline`) all write the same
  keys, and DCP reshards on load from the saved chunk metadata. Only tensors go into
  DCP: the optimizer's hyper-parameters travel in the manifest, so no pickled object is
  ever written or read (below);
* ``rng/rank-R.json``: every random generator of rank R (:mod:`shardlab.distributed.rng`);
* ``manifest.json``: the run's description, the data position, the scheduler's state,
  AdamW's hyper-parameters, the loss history and the SHA-256 of every file
  (:mod:`shardlab.distributed.checkpoint_manifest`, which also finds and verifies
  checkpoints).

**Atomic.** Every rank writes into ``step-N.tmp``; after a barrier (every rank's
shards are on disk: DCP's writer fsyncs them) rank 0 hashes the files, writes the
manifest and renames the folder to ``step-N``. A crash or a SIGKILL at any moment
before the rename leaves only a ``*.tmp`` folder, which loading ignores, so the
previous checkpoint stays the one that loads. Then rank 0 keeps the last ``keep``
checkpoints at or below N (a later one, from a run that was resumed earlier, is
overwritten when the run reaches it, never deleted).

**Async** (``dcp.async_save``): the state is staged into a CPU copy and written by a
background thread through a dedicated gloo group (as torchtitan does, so its
collectives never interleave with training's on the default group); training goes
on, and the save is finished (barrier, manifest, rename) at the next save or at the
end of training.

**Loading reads data, never code**: every load goes through the restricted metadata
reader and the tensors-only planner of :mod:`shardlab.distributed.checkpoint_reader`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

import shardlab
from shardlab.config.model import ModelShape
from shardlab.distributed import rng
from shardlab.distributed.checkpoint_manifest import (
    FORMAT,
    complete_steps,
    step_dir,
    write_manifest,
)
from shardlab.distributed.checkpoint_reader import safe_load_planner, safe_reader
from shardlab.nn.model import TransformerLM


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def load_model_state(folder: str | os.PathLike[str], shape: ModelShape) -> dict[str, Any]:
    """The whole model's parameters from a checkpoint, in one process without any process
    group (DCP reshards from however many ranks wrote it), keyed as TransformerLM's."""
    model = TransformerLM(shape)
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=safe_reader(folder), planner=safe_load_planner(),
                 no_dist=True)
    model.load_state_dict(state["model"])
    return {name: p.detach() for name, p in model.state_dict().items()}


# --- in a rank ----------------------------------------------------------------------------

def state_module(modules: list[nn.Module]) -> nn.Module:
    """One module whose parameter names are the full model's, over what this rank holds:
    the model itself, its one pipeline stage, or (virtual stages) a container of its
    stages' parts registered under the stage's own names."""
    if len(modules) == 1:
        return modules[0]

    class RankParts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleDict()
            for stage in modules:
                for attr in ("embed", "pos", "final_norm", "lm_head"):
                    if getattr(stage, attr, None) is not None:
                        setattr(self, attr, getattr(stage, attr))
                for key, block in stage.blocks.items():  # type: ignore[union-attr]
                    self.blocks[key] = block

    return RankParts()


def _json_value(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


class Checkpointer:
    """Saves and loads one rank's share of the training state (see the module docstring).

    ``modules`` are what the rank trains (the model, or its pipeline stages); ``meta`` is
    the run's description for the manifest (shape, layout, data). Collective: every rank
    calls :meth:`save`, :meth:`finish` and :meth:`load` at the same points.
    """

    def __init__(self, root: str, modules: list[nn.Module], opt: torch.optim.Optimizer,
                 sched: Any, *, rank: int, world: int, keep: int, async_save: bool,
                 meta: dict[str, Any], timeout_s: float = 60.0) -> None:
        self.root, self.rank, self.world, self.keep = Path(root), rank, world, keep
        self.model, self.opt, self.sched, self.meta = state_module(modules), opt, sched, meta
        self.pending: tuple[Any, int, Path, dict[str, Any]] | None = None
        self.seconds: list[float] = []  # wall time of each save, as the caller waited
        # A separate group for the background writer's collectives (gloo works on CPU
        # tensors whatever the training backend).
        self.group = (dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                      if async_save else None)

    def _options(self) -> Any:
        return StateDictOptions(flatten_optimizer_state_dict=True)

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors for DCP, the optimizer's non-tensor values by key)."""
        model_sd, optim_sd = get_state_dict(self.model, self.opt, options=self._options())
        tensors = {k: v for k, v in optim_sd.items() if k.startswith("state.")}
        return {"model": model_sd, "optim": tensors}, optim_sd

    def save(self, step: int, history: dict[str, list[float]],
             kill_before_rename: bool = False) -> None:
        """Write the state after ``step`` optimizer steps into ``step-N`` (atomically).

        ``kill_before_rename`` (tests): SIGKILL this rank after its shards are written and
        before the checkpoint is renamed into place.
        """
        start = time.perf_counter()
        self.finish()  # an async save still in flight completes first
        tmp = self.root / f"step-{step}.tmp"
        if self.rank == 0:  # a crash may have left one behind
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "rng").mkdir(parents=True)
        dist.barrier()
        state, optim_sd = self._state()
        groups = {k.rsplit(".", 1)[1]: _json_value(v) for k, v in optim_sd.items()
                  if k.startswith("param_groups.")}
        (tmp / "rng" / f"rank-{self.rank}.json").write_text(json.dumps(rng.capture()))
        # One global batch per step: the data position is the step count.
        data = {**self.meta.get("data", {}), "batches_consumed": step}
        meta = {**self.meta, "data": data, "step": step, "history": history,
                "scheduler": self.sched.state_dict(), "optimizer": groups}
        writer = dcp.FileSystemWriter(str(tmp))
        if self.group is not None:
            future = dcp.async_save(state, storage_writer=writer, process_group=self.group)
            self.pending = (future, step, tmp, meta)
        else:
            dcp.save(state, storage_writer=writer)
            if kill_before_rename:
                os.kill(os.getpid(), signal.SIGKILL)
            self._rename(step, tmp, meta)
        self.seconds.append(time.perf_counter() - start)

    def finish(self) -> None:
        """Wait for an async save in flight, then put it in place."""
        if self.pending is not None:
            future, step, tmp, meta = self.pending
            self.pending = None
            future.result()
            self._rename(step, tmp, meta)

    def _rename(self, step: int, tmp: Path, meta: dict[str, Any]) -> None:
        dist.barrier()  # every rank's shards are on disk
        if self.rank == 0:
            write_manifest(tmp, {"format": FORMAT, **meta, "world_size": self.world,
                                 "shardlab": shardlab.__version__,
                                 "torch": torch.__version__, "created": time.time()})
            final = step_dir(self.root, step)
            if final.exists():  # the same step from an earlier run of a resumed job
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            self._prune(step)
        dist.barrier()

    def _prune(self, step: int) -> None:
        older = sorted(s for s in complete_steps(self.root) if s <= step)
        for s in older[:-self.keep]:
            shutil.rmtree(step_dir(self.root, s), ignore_errors=True)
        for p in self.root.glob("step-*.tmp"):  # partial saves a crash left behind
            m = re.match(r"^step-(\d+)\.tmp$", p.name)
            if m and int(m.group(1)) < step:
                shutil.rmtree(p, ignore_errors=True)

    def load(self, folder: str | os.PathLike[str], doc: dict[str, Any]) -> None:
        """Fill the model, optimizer, scheduler and (same world size) RNGs from ``folder``,
        whatever layout wrote it. ``doc`` is its verified manifest."""
        state, optim_sd = self._state()
        saved = set(safe_reader(folder).read_metadata().state_dict_metadata)
        # A tied head held as its own copy on the last pipeline stage has no optimizer
        # state of its own in a checkpoint written without pipeline stages: it takes the
        # embedding's (both copies step identically, tied_embedding.sync_tied_grads).
        copies, renamed = [], []
        for key in [k for k in state["optim"] if f"optim.{k}" not in saved]:
            twin = key.replace("lm_head.weight", "embed.weight")
            if twin == key or f"optim.{twin}" not in saved:
                continue
            if twin in state["optim"]:  # both copies on this rank: load one, copy it
                copies.append((key, twin, state["optim"].pop(key)))
            else:  # read the embedding's entry into the head's tensor
                state["optim"][twin] = state["optim"].pop(key)
                renamed.append((key, twin))
        dcp.load(state, storage_reader=safe_reader(folder), planner=safe_load_planner())
        for key, twin in renamed:
            state["optim"][key] = state["optim"].pop(twin)
        for key, twin, held in copies:
            held.copy_(state["optim"][twin])
            state["optim"][key] = held
        groups = doc["optimizer"]
        for key in optim_sd:
            if key.startswith("param_groups."):
                value = groups[key.rsplit(".", 1)[1]]
                optim_sd[key] = tuple(value) if isinstance(value, list) else value
        optim_sd.update(state["optim"])
        set_state_dict(self.model, self.opt, model_state_dict=state["model"],
                       optim_state_dict=optim_sd, options=self._options())
        self.sched.load_state_dict(doc["scheduler"])
        mine = Path(folder, "rng", f"rank-{self.rank}.json")
        if doc["world_size"] == self.world and mine.is_file():
            rng.restore(json.loads(mine.read_text()))
