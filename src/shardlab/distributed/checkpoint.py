"""Training checkpoints that survive crashes, resume exactly and reshard on load.

A checkpoint is a folder ``ROOT/step-N`` (N = optimizer steps done) holding:

* the model and AdamW state as a ``torch.distributed.checkpoint`` (DCP) save: the
  rank's tensor shards as raw bytes in ``__R_0.distcp`` and ``__R_1.distcp``
  (:mod:`shardlab.distributed.checkpoint_writer`, two files written by two threads) and
  DCP's ``.metadata``. The state
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
  AdamW's hyper-parameters, the loss history and the XXH3-64 of every file
  (:mod:`shardlab.distributed.checkpoint_manifest`, which also finds and verifies
  checkpoints).

**Atomic.** Every rank writes into ``step-N.tmp``, fsyncs its files and leaves the
XXH3-64s it computed while writing in ``digests/rank-R.json``; after a barrier rank 0
puts them (and the small files' own) in the manifest, removes ``digests``, fsyncs the
folder and renames it to ``step-N``, then fsyncs the parent. A crash or a SIGKILL at
any moment before the rename leaves only a ``*.tmp`` folder, which loading ignores, so the
previous checkpoint stays the one that loads. Then rank 0 keeps the last ``keep``
checkpoints at or below N (a later one, from a run that was resumed earlier, is
overwritten when the run reaches it, never deleted).

**Async** (``dcp.async_save``, the default of ``shardlab train``): the state is staged
into a CPU copy, reused from save to save, and written by a background thread through a
dedicated gloo group (as torchtitan does, so its collectives never interleave with
training's on the default group); training goes on, and a second background thread
puts the checkpoint in place (barrier on that group, manifest, rename) as soon as every
rank's files are written; the next save and the end of training wait for it. Where that
is safe, and the memory check that falls back to synchronous saves:
:mod:`shardlab.distributed.checkpoint_async`.

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
from concurrent.futures import Future, ThreadPoolExecutor
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
from shardlab.distributed import checkpoint_async, rng
from shardlab.distributed.checkpoint_manifest import (
    FORMAT,
    complete_steps,
    step_dir,
    write_manifest,
)
from shardlab.distributed.checkpoint_reader import safe_load_planner, safe_reader
from shardlab.distributed.checkpoint_writer import RawWriter
from shardlab.nn.model import TransformerLM


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())



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


def adam_state(opt: torch.optim.Optimizer) -> None:
    """Give a torch Adam or AdamW that has not stepped yet the state tensors its first step
    would create (torch 2.13 ``optim/adam.py``, ``_init_group``: ``step``, ``exp_avg``,
    ``exp_avg_sq``, and ``max_exp_avg_sq`` with amsgrad), for a load to fill.

    Otherwise ``get_state_dict`` creates them by running a whole step with zero gradients
    and a zero learning rate (``_init_optim_state``), which on a resume costs more than
    reading the checkpoint: 0.53 s against 0.21 s for a 528.6 MB state on this machine.
    Like that step, it acts only before any gradient exists; other optimizers are left
    to it. The values are overwritten by the load (and ``load_state_dict`` recasts
    ``step`` as the optimizer's options want it)."""
    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW) or opt.state:
        return
    groups = opt.param_groups
    if any(p.grad is not None for g in groups for p in g["params"]):
        return
    for group in groups:
        on_device = bool(group["capturable"] or group["fused"])
        wide = torch.get_default_dtype() == torch.float64 and not group["fused"]
        for p in group["params"]:
            if not p.requires_grad:
                continue
            state = {"step": torch.zeros((), dtype=torch.float64 if wide else torch.float32,
                                         device=p.device if on_device else "cpu")}
            moments = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
            for name in moments:
                state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
            opt.state[p] = state


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
        self.pending: Future[None] | None = None  # a background save, until put in place
        self.seconds: list[float] = []  # wall time of each save, as the caller waited
        # A separate group for the background writer's collectives (gloo works on CPU
        # tensors whatever the training backend).
        self.group = (dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                      if async_save else None)
        # Whether saves run in the background: decided at the first save, when the state
        # to stage exists (checkpoint_async.fits); None until then.
        self.background: bool | None = None if async_save else False
        self.stager = checkpoint_async.stager() if async_save else None
        # One thread that waits for each background write and then puts the checkpoint
        # in place at once (not at the next save: a crash in between would lose it).
        self.finisher = ThreadPoolExecutor(1, "shardlab-checkpoint") if async_save else None

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
        before the checkpoint is renamed into place (synchronous saves only: every rank
        must take the same path, so the run asks for ``async_save=False``).
        """
        start = time.perf_counter()
        self.finish()  # an async save still in flight completes first
        tmp = self.root / f"step-{step}.tmp"
        if self.rank == 0:  # a crash may have left one behind
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "rng").mkdir(parents=True)
            (tmp / "digests").mkdir()
        dist.barrier()
        state, optim_sd = self._state()
        groups = {k.rsplit(".", 1)[1]: _json_value(v) for k, v in optim_sd.items()
                  if k.startswith("param_groups.")}
        _write_synced(tmp / "rng" / f"rank-{self.rank}.json", json.dumps(rng.capture()))
        # One global batch per step: the data position is the step count.
        data = {**self.meta.get("data", {}), "batches_consumed": step}
        # A copy as of now: a background save writes the manifest later, when the history
        # lists the caller keeps appending to (and the scheduler) may have moved on.
        meta = json.loads(json.dumps({**self.meta, "data": data, "step": step,
                                      "history": history, "scheduler": self.sched.state_dict(),
                                      "optimizer": groups}))
        writer = RawWriter(tmp)
        if self.background is None:
            self.background = checkpoint_async.fits(state, self.world, self.group, self.rank)
        if kill_before_rename and self.background:
            raise ValueError("kill_before_rename needs synchronous saves (async_save=False)")
        if self.background:
            assert self.finisher is not None
            upload = dcp.async_save(state, storage_writer=writer, process_group=self.group,
                                    async_stager=self.stager)
            self.pending = self.finisher.submit(self._finish_background, upload, step, tmp,
                                                meta, writer)
        else:
            dcp.save(state, storage_writer=writer)
            if kill_before_rename:
                os.kill(os.getpid(), signal.SIGKILL)
            self._rename(step, tmp, meta, writer, None)
        self.seconds.append(time.perf_counter() - start)

    def _finish_background(self, upload: Any, step: int, tmp: Path, meta: dict[str, Any],
                           writer: RawWriter) -> None:
        upload.result()  # this rank's files written and fsynced, or the write's error
        # Over the background group: training's collectives go on on the default one.
        self._rename(step, tmp, meta, writer, self.group)

    def finish(self) -> None:
        """Wait until the save in flight (if any) is written and in place; raise its error."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def _rename(self, step: int, tmp: Path, meta: dict[str, Any], writer: RawWriter,
                group: Any) -> None:
        # The XXH3-64 of this rank's files, as its writer computed them (rank 0 reads no
        # other rank's shards); not synced: the folder is read back before the rename.
        (tmp / "digests" / f"rank-{self.rank}.json").write_text(json.dumps(writer.digests))
        dist.barrier(group=group)  # every rank's shards are fsynced, with their digests
        if self.rank == 0:
            digests: dict[str, Any] = {}
            for p in sorted((tmp / "digests").glob("rank-*.json")):
                digests.update(json.loads(p.read_text()))
            shutil.rmtree(tmp / "digests")
            write_manifest(tmp, {"format": FORMAT, **meta, "world_size": self.world,
                                 "shardlab": shardlab.__version__,
                                 "torch": torch.__version__, "created": time.time()},
                           digests)
            for folder in (tmp / "rng", tmp):  # the files' names are durable too
                _fsync_dir(folder)
            final = step_dir(self.root, step)
            if final.exists():  # the same step from an earlier run of a resumed job
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            self._prune(step)
        dist.barrier(group=group)

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
        adam_state(self.opt)
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
