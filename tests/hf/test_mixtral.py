"""Mixtral and Qwen3-MoE: ``shardlab export`` of a mixture-of-experts checkpoint loads in
transformers as MixtralForCausalLM (Qwen3MoeForCausalLM with query/key norms) with the same
logits, and ``shardlab import`` reads both layouts of the expert weights (per expert, and
transformers 5's fused tensors) back exactly.

The checkpoint is written here with DCP in one process (no training): export reads it as
it reads any training checkpoint.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from shardlab.cli import main
from shardlab.config.hf_export import hf_config
from shardlab.config.model import ModelShape, MoE
from shardlab.distributed.checkpoint_manifest import FORMAT, shape_record, write_manifest
from shardlab.hf.weights import read_weights, to_hf
from shardlab.nn.model import TransformerLM, numel

# Mixtral's own rotary base (1e6, not the default 10 000): the logits test holds both
# sides to it.
SHAPE = ModelShape("tiny-mixtral", 2, 32, 4, 64, 32, kv_heads=2, style="llama", tied=False,
                   moe=MoE(4, 2, 16), rope_theta=1e6)
# Qwen3-MoE: the same experts with Qwen3's query/key norms and a head width that is not
# d_model / heads.
QWEN3_MOE = ModelShape("tiny-qwen3-moe", 2, 32, 4, 64, 32, kv_heads=2, head_dim=16,
                       style="llama", tied=False, moe=MoE(4, 2, 16), rope_theta=1e6,
                       qk_norm=True)
# fp32, same math in another order (experts summed per expert there, per token here):
LOGITS_ATOL, LOGITS_RTOL = 1e-5, 1e-5


def model(shape: ModelShape = SHAPE) -> TransformerLM:
    m = TransformerLM(shape, seed=1)
    with torch.no_grad():  # a decisive router: no near-tie that rounding could flip
        for block in m.blocks:
            block.mlp.router.weight.mul_(50)
    return m


def write_checkpoint(folder: Path, m: TransformerLM) -> Path:
    """``folder/step-1``: the model's state as DCP and a manifest, as training writes them."""
    state = {k: v.clone() for k, v in m.state_dict().items()}
    step = folder / "step-1"
    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": state}, checkpoint_id=str(step), no_dist=True)
    write_manifest(step, {"format": FORMAT, "step": 1, "shape": shape_record(m.shape)})
    return folder


def ids() -> torch.Tensor:
    return torch.randint(0, SHAPE.vocab, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TransformerLM]:
    root = tmp_path_factory.mktemp("mixtral")
    m = model()
    ckpt = write_checkpoint(root / "ckpt", m)
    assert main(["export", str(ckpt), str(root / "hf")]) == 0
    return root / "hf", m


def test_transformers_loads_the_same_logits(exported: tuple[Path, TransformerLM],
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers")
    out, m = exported
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MixtralForCausalLM"] and config["rope_theta"] == 1e6
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "MixtralForCausalLM"
    assert sum(p.numel() for p in hf.parameters()) == numel(m)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids()).logits, m(ids()),
                                   atol=LOGITS_ATOL, rtol=LOGITS_RTOL)
    # ... and back: import gives the exported weights exactly
    assert main(["import", str(out), str(tmp_path / "back"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == numel(m)
    got, want = read_weights(tmp_path / "back"), m.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_import_reads_transformers_own_layouts(exported: tuple[Path, TransformerLM],
                                               tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    out, m = exported
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    hf.save_pretrained(tmp_path / "saved")  # transformers 5 writes per-expert names back
    fused = tmp_path / "fused"  # its modules' own names: mlp.experts.gate_up_proj, ...
    fused.mkdir()
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()},
              str(fused / "model.safetensors"))
    (fused / "config.json").write_text((out / "config.json").read_text())
    assert "model.layers.0.mlp.experts.gate_up_proj" in hf.state_dict()
    want = m.state_dict()
    for folder in (tmp_path / "saved", fused):
        assert main(["import", str(folder), str(folder) + "-in"]) == 0
        got = read_weights(str(folder) + "-in")
        assert all(torch.equal(got[k], want[k]) for k in want), folder.name


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("edit", "named"), [
    ({"router_jitter_noise": 0.01}, "router_jitter_noise=0.01: must be 0"),
    ({"sliding_window": 8}, "sliding_window=8: must be null"),
    ({"output_router_logits": True}, "output_router_logits=True: must be false"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok=5: must be <= num_local_experts (4)"),
    (None, "weights='model.layers.1.block_sparse_moe.experts.3.w2.weight': is missing"),
])
def test_import_refuses_what_it_cannot_model(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             edit: dict[str, Any] | None, named: str) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    tensors = to_hf(model().state_dict(), SHAPE)
    if edit is None:
        del tensors["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    (hf / "config.json").write_text(json.dumps(hf_config(SHAPE) | (edit or {})))
    save_file(tensors, str(hf / "model.safetensors"))
    err = refused(["import", str(hf), str(tmp_path / "out")], capsys)
    assert err.startswith(f"shardlab import: error: {named}"), err
    assert not (tmp_path / "out").exists()


def test_export_refuses_shared_experts(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    deepseekish = ModelShape("deepseekish", 1, 32, 4, 64, 32, style="llama",
                             moe=MoE(4, 2, 16, shared_experts=1))
    ckpt = write_checkpoint(tmp_path / "ckpt", TransformerLM(deepseekish))
    err = refused(["export", str(ckpt), str(tmp_path / "hf")], capsys)
    assert err.startswith("shardlab export: error: moe.shared_experts=1: must be 0 to "
                          "export: transformers' Mixtral has no shared experts"), err
    assert not (tmp_path / "hf").exists()


def test_qwen3_moe_exports_and_imports_with_the_same_logits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers")
    m = model(QWEN3_MOE)
    with torch.no_grad():  # norms that are not all ones, so a dropped one would show
        for block in m.blocks:
            block.attn.q_norm.weight.uniform_(0.5, 1.5)
            block.attn.k_norm.weight.uniform_(0.5, 1.5)
    ckpt = write_checkpoint(tmp_path / "ckpt", m)
    out = tmp_path / "hf"
    assert main(["export", str(ckpt), str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["family"] == "qwen3_moe"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["norm_topk_prob"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"
    assert sum(p.numel() for p in hf.parameters()) == numel(m)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids()).logits, m(ids()),
                                   atol=LOGITS_ATOL, rtol=LOGITS_RTOL)
    # ... and back, from the export and from transformers' own fused names
    fused = tmp_path / "fused"
    fused.mkdir()
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()},
              str(fused / "model.safetensors"))
    (fused / "config.json").write_text((out / "config.json").read_text())
    want = m.state_dict()
    for folder in (out, fused):
        assert main(["import", str(folder), str(folder) + "-in"]) == 0
        got = read_weights(str(folder) + "-in")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_qwen3_moe_router_without_renormalised_weights_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(hf_config(QWEN3_MOE) | {"norm_topk_prob": False}))
    save_file(to_hf(model(QWEN3_MOE).state_dict(), QWEN3_MOE), str(hf / "model.safetensors"))
    err = refused(["import", str(hf), str(tmp_path / "out")], capsys)
    assert err.startswith("shardlab import: error: norm_topk_prob=False: must be true"), err
    assert not (tmp_path / "out").exists()
