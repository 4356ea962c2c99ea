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
* ``manifest.json``: format, step, model shape, layout, world size, shardlab and torch
  versions, the data position, the LR scheduler's state, AdamW's hyper-parameters,
  the loss history so far, the size and SHA-256 of every other file, and the SHA-256
  of the manifest itself (``manifest_sha256``, over the canonical JSON of the rest).

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

**Loading reads data, never code.** DCP reads its tensors safely
(``torch.load(f, weights_only=True)``), but unpickles its ``.metadata`` with plain
``pickle`` and any non-tensor value without that guard (torch 2.13,
``distributed/checkpoint/filesystem.py`` and ``default_planner.py``). :func:`safe_reader`
reads the metadata with an unpickler that resolves only DCP's own metadata dataclasses
and torch's ``Size``/dtype/layout names, and :func:`safe_load_planner` refuses any
non-tensor item. Before any rank starts, :func:`verify` checks the manifest's own
checksum and every file's size and SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardlab.errors import SpecError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from shardlab.config.model import ModelShape

FORMAT = 1
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")
# What a manifest names that must match the run that loads it for the data stream to
# continue where it stopped (the position is a count of batches of this stream).
DATA_FIELDS = ("fingerprint", "seed", "global_batch", "seq")


# --- names and listing --------------------------------------------------------------------

def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """``root/step-N``: where the checkpoint after ``step`` optimizer steps lives."""
    return Path(root, f"step-{step}")


def complete_steps(root: str | os.PathLike[str]) -> dict[int, Path]:
    """Checkpoints renamed into place (``step-N`` with a manifest), by step; ``*.tmp`` and
    anything else in the folder are ignored."""
    folder = Path(root)
    if not folder.is_dir():
        return {}
    found = {}
    for p in folder.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / MANIFEST).is_file():
            found[int(m.group(1))] = p
    return found


def find(root: str | os.PathLike[str], step: int | None = None) -> Path:
    """The checkpoint to resume from: the latest complete one, or the one at ``step``."""
    folder = Path(root)
    if not folder.is_dir():
        raise SpecError("checkpoint_dir", str(folder), "does not exist (nothing to resume)")
    steps = complete_steps(folder)
    if not steps:
        raise SpecError("resume", "latest" if step is None else step,
                        f"no complete checkpoint in {folder} (partial *.tmp folders are "
                        "ignored)")
    if step is None:
        return steps[max(steps)]
    if step not in steps:
        raise SpecError("resume", step, f"no checkpoint at that step in {folder}; found "
                        f"{', '.join(str(s) for s in sorted(steps))}")
    return steps[step]


# --- manifest and checksums ---------------------------------------------------------------

def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()


def _digest(doc: dict[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _files(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size,
                                               "sha256": sha256_file(p)}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Add the files' sizes and hashes and the manifest's own hash; write it atomically."""
    doc = {**doc, "files": _files(folder)}
    doc["manifest_sha256"] = _digest(doc)
    tmp = folder / (MANIFEST + ".tmp")
    with tmp.open("w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(folder / MANIFEST)
    return doc


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a checkpoint folder, its own checksum checked (SpecError if not)."""
    path = Path(folder, MANIFEST)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise SpecError("checkpoint", str(folder), f"has no readable {MANIFEST} "
                        f"({e.strerror or e})") from e
    except ValueError as e:
        raise SpecError("checkpoint", str(path), f"is not valid JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("manifest_sha256") != _digest(doc):
        raise SpecError("checkpoint", str(path), "manifest checksum does not match its "
                        "contents (corrupt or edited)")
    if doc.get("format") != FORMAT:
        raise SpecError("checkpoint", str(path), f"format {doc.get('format')!r}; this "
                        f"shardlab reads format {FORMAT}")
    return doc


def verify(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest, after checking every file it lists: present, same size, same SHA-256,
    and DCP's metadata readable by :func:`safe_reader`. SpecError names the first bad file."""
    folder = Path(folder)
    doc = read_manifest(folder)
    for name, info in doc["files"].items():
        path = folder / name
        if not path.is_file():
            raise SpecError("checkpoint", str(path), "is missing")
        if path.stat().st_size != info["bytes"]:
            raise SpecError("checkpoint", str(path), f"has {path.stat().st_size} bytes, the "
                            f"manifest says {info['bytes']} (truncated?)")
        if sha256_file(path) != info["sha256"]:
            raise SpecError("checkpoint", str(path), "SHA-256 does not match the manifest "
                            "(corrupt)")
    try:
        safe_reader(folder).read_metadata()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
        raise SpecError("checkpoint", str(folder / ".metadata"), f"unreadable: {e}") from e
    return doc


def shape_record(shape: ModelShape) -> dict[str, Any]:
    """The architecture fields of a shape (not its name or where it came from)."""
    record = asdict(shape)
    for key in ("name", "source"):
        record.pop(key)
    return record


def check_compatible(doc: dict[str, Any], shape: ModelShape, data: dict[str, Any],
                     where: str) -> None:
    """SpecError naming the first model-shape or data field that differs from ``doc``'s."""
    saved = doc["shape"]
    for key, now in shape_record(shape).items():
        if saved.get(key) != now:
            raise SpecError(key, now, f"differs from the checkpoint's {key}={saved.get(key)!r} "
                            f"({where}): a checkpoint loads only into the model shape "
                            "that wrote it")
    for key in DATA_FIELDS:
        if doc["data"].get(key) != data.get(key):
            name = "data" if key == "fingerprint" else key
            raise SpecError(name, data.get(key) if key != "fingerprint" else "(corpus)",
                            f"differs from the checkpoint's ({where}): the data position "
                            "counts batches of the stream it was saved with")


def data_fingerprint(docs: list[list[int]]) -> str:
    """SHA-256 of the corpus (document lengths and token ids, little-endian int64)."""
    import numpy as np

    h = hashlib.sha256()
    h.update(np.asarray([len(d) for d in docs], dtype="<i8").tobytes())
    for d in docs:
        h.update(np.asarray(d, dtype="<i8").tobytes())
    return h.hexdigest()


# --- reading safely -----------------------------------------------------------------------

_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                 "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta",
                 "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by name (torch.strided), a lookup
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds DCP's metadata and nothing else (no callable, no import)."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in _METADATA_CLASSES or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


def _safe_reader_class() -> type:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _SafeReader(FileSystemReader):
        """DCP's file reader with the metadata read by :class:`_MetadataUnpickler`."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _SafeReader


def safe_reader(folder: str | os.PathLike[str]) -> Any:
    """A ``FileSystemReader`` for ``folder`` whose metadata unpickling is restricted."""
    return _safe_reader_class()(str(folder))


def safe_load_planner() -> Any:
    """DCP's default load planner, refusing non-tensor (pickled) items."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class _TensorsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            raise SpecError("checkpoint", read_item.dest_index.fqn,
                            "is a pickled object; shardlab loads tensors only")

    return _TensorsOnly()


def load_model_state(folder: str | os.PathLike[str], shape: ModelShape) -> dict[str, Any]:
    """The whole model's parameters from a checkpoint, in one process without any process
    group (DCP reshards from however many ranks wrote it), keyed as TransformerLM's."""
    import torch.distributed.checkpoint as dcp

    from shardlab.nn.model import TransformerLM

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
    from torch import nn

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
        from datetime import timedelta

        import torch.distributed as dist

        self.root, self.rank, self.world, self.keep = Path(root), rank, world, keep
        self.model, self.opt, self.sched, self.meta = state_module(modules), opt, sched, meta
        self.pending: tuple[Any, int, Path, dict[str, Any]] | None = None
        self.seconds: list[float] = []  # wall time of each save, as the caller waited
        # A separate group for the background writer's collectives (gloo works on CPU
        # tensors whatever the training backend).
        self.group = (dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                      if async_save else None)

    def _options(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(flatten_optimizer_state_dict=True)

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors for DCP, the optimizer's non-tensor values by key)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.opt, options=self._options())
        tensors = {k: v for k, v in optim_sd.items() if k.startswith("state.")}
        return {"model": model_sd, "optim": tensors}, optim_sd

    def save(self, step: int, history: dict[str, list[float]],
             kill_before_rename: bool = False) -> None:
        """Write the state after ``step`` optimizer steps into ``step-N`` (atomically).

        ``kill_before_rename`` (tests): SIGKILL this rank after its shards are written and
        before the checkpoint is renamed into place.
        """
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        from shardlab.distributed import rng

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
        import torch
        import torch.distributed as dist

        import shardlab

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
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        from shardlab.distributed import rng

        state, optim_sd = self._state()
        saved = set(safe_reader(folder).read_metadata().state_dict_metadata)
        # A tied head held as its own copy on the last pipeline stage has no optimizer
        # state of its own in a checkpoint written without pipeline stages: it takes the
        # embedding's (both copies step identically, pipeline.sync_tied_grads).
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
