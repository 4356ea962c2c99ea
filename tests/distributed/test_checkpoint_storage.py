"""Checkpoint storage in one process: the raw tensor layout read into any region, the
manifest's XXH3-64 and the older SHA-256 format, and saves in the background (complete
once finished, invisible before, synchronous when memory is short). The runs of every
layout, resumed and resharded, are tests/distributed/test_checkpoint.py's."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

from shardlab.config.model import ModelShape
from shardlab.distributed import checkpoint_async, checkpoint_manifest
from shardlab.distributed.checkpoint import Checkpointer, load_model_state
from shardlab.distributed.checkpoint_reader import _span, safe_reader
from shardlab.distributed.checkpoint_writer import RawWriter
from shardlab.errors import SpecError
from shardlab.nn.model import TransformerLM

# dcp.save/load with no_dist=True warn that they assume one process: they do.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
SHAPE = ModelShape("tiny", 2, 32, 4, 64, 16, style="llama", tied=False)


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A one-rank gloo group in this process (a HashStore: no port, no launch)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _trained() -> tuple[TransformerLM, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = TransformerLM(SHAPE)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def _step(model: TransformerLM, opt: torch.optim.Optimizer) -> None:
    model(torch.arange(8).reshape(1, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_span_is_the_contiguous_run_of_a_region() -> None:
    chunk = torch.arange(4 * 5 * 3).reshape(4, 5, 3)
    for offsets, lengths in [((0, 0, 0), (4, 5, 3)), ((1, 0, 0), (2, 5, 3)),
                             ((2, 1, 0), (1, 3, 3)), ((3, 4, 1), (1, 1, 2)),
                             ((0, 1, 0), (2, 3, 3)), ((0, 0, 1), (4, 5, 1))]:
        region = chunk[tuple(slice(o, o + n) for o, n in zip(offsets, lengths, strict=True))]
        span = _span(chunk.shape, offsets, lengths)
        first = int(region.reshape(-1)[0])
        contiguous = region.reshape(-1).tolist() == list(range(first, first + region.numel()))
        assert (span is not None) == contiguous, (offsets, lengths)
        if span is not None:
            assert span == (first, region.numel())


def test_raw_items_are_read_into_any_region_and_dtype(tmp_path: Path) -> None:
    """The direct read (whole rows into a contiguous target), the staged one (another
    dtype, a transposed target) and the whole-chunk one (a column block), exactly."""
    w = torch.randn(8, 6)
    dcp.save({"w": w}, storage_writer=RawWriter(tmp_path), no_dist=True)
    reader = safe_reader(tmp_path)
    reader.set_up_storage_reader(reader.read_metadata(), True)
    regions = {((2, 0), (3, 6)): torch.empty(3, 6), ((0, 0), (8, 6)): torch.empty(8, 6,
               dtype=torch.bfloat16), ((0, 1), (8, 4)): torch.empty(4, 8).t(),
               ((5, 2), (1, 3)): torch.empty(1, 3)}

    class Targets:
        def resolve_tensor(self, req: ReadItem) -> torch.Tensor:
            return regions[(tuple(req.storage_offsets), tuple(req.lengths))]

        def commit_tensor(self, req: ReadItem, tensor: torch.Tensor) -> None:
            pass

    items = [ReadItem(LoadItemType.TENSOR, MetadataIndex("w"), torch.Size([0, 0]),
                      MetadataIndex("w", torch.Size([0, 0])), torch.Size(o), torch.Size(n))
             for o, n in regions]
    reader.read_data(LoadPlan(items), Targets()).wait()  # type: ignore[arg-type]
    for (o, n), got in regions.items():
        want = w[o[0]:o[0] + n[0], o[1]:o[1] + n[1]].to(got.dtype)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    shard = tmp_path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(SpecError, match="truncated"):
        reader.read_data(LoadPlan(items[:1]), Targets()).wait()  # type: ignore[arg-type]


def test_each_file_carries_the_xxh3_of_its_bytes(tmp_path: Path) -> None:
    """The XXH3-64 each writer thread computes while writing is the file's own (xxhash's
    one-shot over the bytes on disk), the manifest records it (and the metadata's), and a
    flipped byte is refused naming the file; an empty file's is xxHash's reference value
    for the empty input (its sanity test: XXH3_64bits of no bytes, seed 0)."""
    writer = RawWriter(tmp_path)
    dcp.save({"a": torch.randn(300, 7), "b": torch.arange(1000)}, storage_writer=writer,
             no_dist=True)
    assert sorted(writer.digests) == ["__0_0.distcp", "__0_1.distcp"]
    for name, info in writer.digests.items():
        data = (tmp_path / name).read_bytes()
        assert info == {"bytes": len(data), "xxh3_64": xxhash.xxh3_64_hexdigest(data)}
    checkpoint_manifest.write_manifest(tmp_path, {"format": 2}, writer.digests)
    files = checkpoint_manifest.verify(tmp_path)["files"]
    assert files[".metadata"]["xxh3_64"] == xxhash.xxh3_64_hexdigest(
        (tmp_path / ".metadata").read_bytes())
    shard = tmp_path / "__0_1.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(SpecError, match=r"__0_1\.distcp: XXH3-64 does not match the "
                                        r"manifest \(corrupt\)"):
        checkpoint_manifest.verify(tmp_path)
    (tmp_path / "empty").touch()
    assert checkpoint_manifest.xxh3_file(tmp_path / "empty") == "2d06800538d394c2"


def test_format_1_checkpoints_still_verify_and_load(tmp_path: Path) -> None:
    """A checkpoint as shardlab wrote it before the raw layout: torch.save items and a
    SHA-256 per file; verify checks it and the model loads through DCP's own reader."""
    model = TransformerLM(SHAPE)
    dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(tmp_path),
             no_dist=True)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": checkpoint_manifest.sha256_file(p)}
             for p in tmp_path.iterdir()}
    doc: dict[str, Any] = {"format": 1, "files": files}
    doc["manifest_sha256"] = checkpoint_manifest._digest(doc)
    (tmp_path / checkpoint_manifest.MANIFEST).write_text(json.dumps(doc))
    assert checkpoint_manifest.verify(tmp_path)["format"] == 1
    torch.testing.assert_close(load_model_state(tmp_path, SHAPE), model.state_dict(),
                               rtol=0, atol=0)
    shard = tmp_path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(SpecError, match="SHA-256 does not match"):
        checkpoint_manifest.verify(tmp_path)


def test_background_saves_appear_whole_and_the_last_is_awaited(
        one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save whose write is held back is invisible (only step-1.tmp) while training goes
    on; once written it is put in place without waiting for the next save, with the
    weights and history of its own step; finish() completes the last one."""
    model, opt, sched = _trained()
    _step(model, opt)
    at_1 = {k: v.clone() for k, v in model.state_dict().items()}
    go = threading.Event()
    write = RawWriter._write_file

    def held(self: RawWriter, *args: Any) -> Any:
        assert go.wait(30)
        return write(self, *args)

    monkeypatch.setattr(RawWriter, "_write_file", held)
    ckpt = Checkpointer(str(tmp_path), [model], opt, sched, rank=0, world=1, keep=5,
                        async_save=True, meta={"data": {}})
    losses = [3.0]
    ckpt.save(1, {"losses": losses, "grad_norms": [1.0]})
    assert ckpt.background is True and ckpt.pending is not None
    _step(model, opt)  # training goes on while the write waits
    losses.append(2.0)
    assert not checkpoint_manifest.complete_steps(tmp_path)
    assert (tmp_path / "step-1.tmp").is_dir()
    go.set()
    deadline = time.monotonic() + 30
    while not checkpoint_manifest.complete_steps(tmp_path):  # no finish(), no next save
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ckpt.save(2, {"losses": losses, "grad_norms": [1.0, 1.0]})
    ckpt.finish()
    assert sorted(checkpoint_manifest.complete_steps(tmp_path)) == [1, 2]
    assert not list(tmp_path.glob("*.tmp"))
    first = checkpoint_manifest.verify(tmp_path / "step-1")
    assert first["history"]["losses"] == [3.0] and "digests/rank-0.json" not in first["files"]
    torch.testing.assert_close(load_model_state(tmp_path / "step-1", SHAPE), at_1,
                               rtol=0, atol=0)
    torch.testing.assert_close(load_model_state(tmp_path / "step-2", SHAPE),
                               model.state_dict(), rtol=0, atol=0)
    # A resume: a fresh AdamW gets its state from adam_state (no zero-gradient step)
    model2, opt2, sched2 = _trained()
    Checkpointer(str(tmp_path), [model2], opt2, sched2, rank=0, world=1, keep=5,
                 async_save=False, meta={}).load(tmp_path / "step-2", checkpoint_manifest.verify(
                     tmp_path / "step-2"))
    torch.testing.assert_close(opt2.state_dict()["state"], opt.state_dict()["state"],
                               rtol=0, atol=0)
    torch.testing.assert_close(model2.state_dict(), model.state_dict(), rtol=0, atol=0)


def test_short_memory_saves_synchronously(one_rank: None, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(checkpoint_async, "available_memory_bytes",
                        lambda: (1000.0, "test"))
    model, opt, sched = _trained()
    _step(model, opt)
    ckpt = Checkpointer(str(tmp_path / "c"), [model], opt, sched, rank=0, world=1, keep=1,
                        async_save=True, meta={"data": {}})
    ckpt.save(1, {"losses": [1.0], "grad_norms": [1.0]})
    assert ckpt.background is False and ckpt.pending is None
    assert sorted(checkpoint_manifest.complete_steps(tmp_path / "c")) == [1]
    assert "saved synchronously" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "c")
