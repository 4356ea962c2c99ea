"""``shardlab export`` and ``shardlab import``: checkpoints as Hugging Face folders that
``transformers`` loads with the same logits, and back as initial weights for ``train``.

The checkpoints are written by one-process training in this process (a gloo group of
one, no spawn): export reads them without any process group.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from shardlab.cli import main
from shardlab.config.model import ModelShape
from shardlab.distributed import checkpoint, checkpoint_manifest
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.model import TransformerLM
from shardlab.train.config import TrainConfig

V = garden_vocab().size
SHAPES = {
    "llama": ModelShape("tiny-llama", 2, 32, 4, V, 32, kv_heads=2, style="llama", tied=False),
    "qwen2": ModelShape("tiny-qwen", 2, 32, 4, V, 32, kv_heads=2, style="llama", tied=True,
                        qkv_bias=True),
    "gpt2": ModelShape("tiny-gpt", 2, 32, 4, V, 32, style="gpt", tied=True),
    # Qwen3: query/key norms, and a head width that is not d_model / heads
    "qwen3": ModelShape("tiny-qwen3", 2, 32, 4, V, 32, kv_heads=2, head_dim=16, style="llama",
                        tied=False, qk_norm=True),
}
# fp32, same math in another order (fused attention kernels, RMSNorm written out):
LOGITS_ATOL, LOGITS_RTOL = 1e-5, 1e-5


def train_one_process(cfg: TrainConfig) -> None:
    """train_rank on a gloo group of one in this process."""
    import torch.distributed as dist

    from shardlab.distributed.launch import RankContext
    from shardlab.train.loop import train_rank

    store = dist.FileStore(tempfile.mktemp(prefix="shardlab-store-"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        train_rank(RankContext(0, 1, 0, "cpu", "gloo", 30.0), cfg)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export")
    docs = garden_documents(100, 0)
    for name, shape in SHAPES.items():
        train_one_process(TrainConfig(shape=shape, steps=2, docs=docs,
                                      checkpoint_dir=str(root / name)))
    return {name: root / name for name in SHAPES}


def shardlab_logits(folder: Path, shape: ModelShape, ids: torch.Tensor) -> torch.Tensor:
    model = TransformerLM(shape)
    model.load_state_dict(checkpoint.load_model_state(folder, shape))
    with torch.no_grad():
        return model(ids)


@pytest.mark.parametrize("name", list(SHAPES))
def test_transformers_loads_the_same_logits(checkpoints: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            name: str) -> None:
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "hf"
    assert main(["export", str(checkpoints[name]), str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["step"] == 2 and doc["family"] == name
    assert doc["parameters"] == sum(p.numel() for p in TransformerLM(SHAPES[name]).parameters())
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    ours = shardlab_logits(checkpoints[name] / "step-2", SHAPES[name], ids)
    torch.testing.assert_close(theirs, ours, atol=LOGITS_ATOL, rtol=LOGITS_RTOL)

    # ... and back: import gives the checkpoint's weights exactly
    back = tmp_path / "back"
    assert main(["import", str(out), str(back)]) == 0
    from shardlab.hf.weights import read_weights

    saved = checkpoint.load_model_state(checkpoints[name] / "step-2", SHAPES[name])
    got = read_weights(back)
    assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)


def test_torch_format_and_init_from(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "bin"
    assert main(["export", str(checkpoints["llama"]), str(out), "--format", "torch"]) == 0
    assert (out / "pytorch_model.bin").is_file() and (out / "config.json").is_file()
    hf = tmp_path / "hf"
    assert main(["export", str(checkpoints["llama"]), str(hf)]) == 0
    imported = tmp_path / "imported"
    assert main(["import", str(hf), str(imported)]) == 0
    # train starts from the imported weights: its first loss is the checkpoint's model's
    from shardlab.train.reference import reference_run

    docs = garden_documents(100, 0)
    base = TrainConfig(shape=SHAPES["llama"], steps=1, docs=docs)
    fresh = reference_run(base)
    warm = reference_run(replace(base, init_from=str(imported)))
    manifest = checkpoint_manifest.read_manifest(checkpoints["llama"] / "step-2")
    assert warm[0] < fresh[0] and warm[0] < manifest["history"]["losses"][0]


def _bad(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    return err


def test_bad_input(checkpoints: dict[str, Path], tmp_path: Path,
                   capsys: pytest.CaptureFixture[str]) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert "exists and is not empty" in _bad(["export", str(checkpoints["llama"]), str(full)],
                                             capsys)
    assert (full / "keep.txt").read_text() == "mine" and len(list(full.iterdir())) == 1
    assert "does not exist" in _bad(["export", str(tmp_path / "nowhere"), str(tmp_path / "o")],
                                    capsys)
    assert not (tmp_path / "o").exists()
    assert "has no config.json" in _bad(["import", str(tmp_path), str(tmp_path / "i")], capsys)
    assert "init_from=" in _bad(["train", "--init-from", str(tmp_path)], capsys)


def test_import_refuses_what_the_model_cannot_compute(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    from shardlab.config.hf_export import hf_config

    hf = tmp_path / "hf"
    hf.mkdir()
    config: dict[str, Any] = hf_config(SHAPES["llama"]) | {
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    (hf / "config.json").write_text(json.dumps(config))
    assert "rope_theta=500000.0" in _bad(["import", str(hf), str(tmp_path / "o")], capsys)


def edited_checkpoint(src: Path, dst: Path, **shape: Any) -> Path:
    """A copy of the checkpoint ``src`` whose manifest records ``shape`` edits (a value of
    ... deletes the field), its hashes recomputed as a careful hand-edit would."""
    shutil.copytree(src, dst)
    doc = json.loads((dst / checkpoint_manifest.MANIFEST).read_text())
    for key, value in shape.items():
        if value is ...:
            del doc["shape"][key]
        else:
            doc["shape"][key] = value
    for key in ("files", "manifest_sha256"):
        doc.pop(key)
    checkpoint_manifest.write_manifest(dst, doc)
    return dst


@pytest.mark.parametrize(("edits", "says"), [
    ({"d_ff": 64}, "blocks.0.mlp.gate_proj.weight [64, 32], the checkpoint holds [128, 32]"),
    ({"vocab": V + 1}, f"embed.weight [{V + 1}, 32], the checkpoint holds [{V}, 32]"),
    ({"layers": 3}, "records layers=3 but holds 2 blocks"),
    ({"layers": 4096}, "records layers=4096 but holds 2 blocks"),  # before building it
    ({"d_model": ...}, "its shape record is not a model shape"),
], ids=["d_ff", "vocab", "layers", "huge", "missing"])
def test_export_refuses_an_edited_manifest_shape(checkpoints: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 edits: dict[str, Any], says: str) -> None:
    step = edited_checkpoint(checkpoints["llama"] / "step-2", tmp_path / "step-2", **edits)
    err = _bad(["export", str(step), str(tmp_path / "hf")], capsys)
    # (the error line clips a long path: the field and the reason are what it must hold)
    assert err.startswith("shardlab export: error: checkpoint='") and "manifest" in err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()


def test_export_output_folder(checkpoints: dict[str, Path], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before any work when it cannot be written; written all at once, 0644 under
    umask 022; nothing left anywhere by a write error midway."""
    import shardlab.hf.weights as weights

    ckpt, out = str(checkpoints["llama"]), tmp_path / "hf"
    (tmp_path / "file").write_text("mine")
    assert "is a file" in _bad(["export", ckpt, str(tmp_path / "file")], capsys)
    assert "parent folder" in _bad(["export", ckpt, str(tmp_path / "no" / "hf")], capsys)

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(weights, "save_file", full_disk)
        err = _bad(["export", ckpt, str(out)], capsys)
    assert err.startswith("shardlab export: error: out_dir=") and "No space left" in err
    assert {p.name for p in tmp_path.iterdir()} == {"file"}  # no out, no temporary
    with monkeypatch.context() as m:
        m.setattr(torch, "save", full_disk)
        assert "No space left" in _bad(["export", ckpt, str(out), "--format", "torch"], capsys)
    assert {p.name for p in tmp_path.iterdir()} == {"file"}

    old = os.umask(0o022)
    try:
        assert main(["export", ckpt, str(out)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()} == {
        "config.json": 0o644, "model.safetensors": 0o644}
