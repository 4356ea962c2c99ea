"""``train --dtype fp8``: which linear layers torchao converts, and the refusals before any
rank starts (no fp8 GPU, fp8 sequence gathers on gloo, a width fp8's matmul cannot take),
each one line and
exit 2 with nothing written."""

from __future__ import annotations

import dataclasses
import importlib
import time
from pathlib import Path

import pytest
import torch

from shardlab.cli import build_parser, main
from shardlab.cli.train import check
from shardlab.config.model import ModelShape, MoE
from shardlab.estimate.fp8 import tp_fp8_linears
from shardlab.nn.garden import garden_vocab
from shardlab.nn.model import TransformerLM
from shardlab.train import fp8

fp8._float8()  # torchao imported quietly (its import warnings are not this test's)
Float8Linear = importlib.import_module("torchao.float8.float8_linear").Float8Linear
TINY = ModelShape("tiny", 2, 64, 4, garden_vocab().size, 32, style="llama", tied=False)


def test_the_blocks_linears_convert_and_the_head_and_router_stay_bf16() -> None:
    model = TransformerLM(dataclasses.replace(TINY, moe=MoE(4, 2, 64, shared_experts=1)))
    names = fp8.convert_fp8_linears(model)
    converted = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert converted == set(names) and names
    ends = {n.rsplit(".", 1)[-1] for n in names}
    assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= ends
    assert not ends & set(fp8.KEPT_IN_BF16)  # the output head and the router
    assert not isinstance(model.lm_head, Float8Linear)
    # Every nn.Linear left is one the filter refuses.
    left = [(n, m) for n, m in model.named_modules()
            if type(m) is torch.nn.Linear]
    assert left and not any(fp8.fp8_linear(m, n) for n, m in left)


def test_a_linear_fp8s_matmul_cannot_take_stays_bf16() -> None:
    assert fp8.fp8_linear(torch.nn.Linear(64, 48), "layers.0.mlp.up_proj")
    assert not fp8.fp8_linear(torch.nn.Linear(64, 40), "layers.0.mlp.up_proj")  # 40 % 16
    assert not fp8.fp8_linear(torch.nn.Linear(64, 64), "lm_head")
    assert not fp8.fp8_linear(torch.nn.LayerNorm(64), "norm")


def test_fp8_matmuls_follow_the_bf16_ones_closely() -> None:
    """The converted model's forward within fp8's rounding of the bf16 one (E4M3 keeps 3
    mantissa bits: a relative step of 2^-4 per element, averaged down over the sums)."""
    torch.manual_seed(0)
    model = TransformerLM(TINY)
    ids = torch.randint(0, TINY.vocab, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(ids, None).float()
    fp8.convert_fp8_linears(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, None).float()
    err = (out - ref).norm() / ref.norm()
    assert 0 < err < 0.1  # changed (fp8 ran), not broken


def test_the_machine_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA device" in fp8.fp8_refusal(on_cpu=False)
    assert fp8.fp8_refusal(on_cpu=True) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=0: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=0: "NVIDIA A100-SXM4-80GB")
    why = fp8.fp8_refusal(on_cpu=True)  # a GPU without fp8 is refused even so
    assert why is not None and "A100" in why and "8.0" in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=0: (9, 0))
    assert fp8.fp8_refusal(on_cpu=False) is None


CPU = ["--dtype", "fp8", "--fp8-on-cpu"]


@pytest.mark.parametrize(("argv", "words"), [
    (["--dtype", "fp8"], ("dtype='fp8'", "no CUDA device", "--fp8-on-cpu")),
    ([*CPU, "--tp", "2", "--sp"], ("sp=True", "CUDA/NCCL only", "gloo")),
    ([*CPU, "--d-model", "40", "--heads", "4"], ("d_model=40", "multiple of 16")),
    (["--dtype", "bf16", "--fp8-all-gather"], ("fp8_all_gather=True", "needs --dtype fp8")),
    ([*CPU, "--fp8-all-gather"], ("fp8_all_gather=True", "needs FSDP")),  # one rank
    ([*CPU, "--fp8-all-gather", "--dp", "2", "--dp-mode", "ddp"], ("needs FSDP",)),
    (["--fp8-on-cpu"], ("fp8_on_cpu=True", "needs --dtype fp8")),
])
def test_refused_before_any_rank_with_one_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        argv: list[str], words: tuple[str, ...]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    logs = tmp_path / "logs"
    start = time.monotonic()
    code = main(["train", "--steps", "1", "--log-dir", str(logs), *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert time.monotonic() - start < 5 and not logs.exists()
    assert all(w in err for w in words), err


def test_without_torchao_fp8_is_refused_in_one_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torchao" else real(name, *a))
    assert "needs torchao" in fp8.fp8_refusal(on_cpu=True)
    logs = tmp_path / "logs"
    for argv in (["train", *CPU, "--log-dir", str(logs)],
                 ["dryrun", "--gpus", "2", "--layout", "dp=2", "--dtype", "fp8"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and "needs torchao" in err
    assert not logs.exists()


def test_fp8_gathers_save_checkpoints_in_step(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    """torch's async save mis-stages torchao's fp8-gathered weights (a resumed loss turned
    NaN), so with --fp8-all-gather the run saves in step and says so."""
    argv = ["train", *CPU, "--dp", "2", "--fp8-all-gather", "--checkpoint-dir",
            str(tmp_path / "ck")]
    cfg, _, notes = check(build_parser().parse_args(argv))
    assert not cfg.async_save and any("saved in step" in n for n in notes)
    plain, _, _ = check(build_parser().parse_args([*argv[:-3], "--checkpoint-dir",
                                                   str(tmp_path / "ck2")]))
    assert plain.async_save  # plain fp8 keeps the background save


def test_tensor_parallel_converts_the_linears_the_byte_count_names() -> None:
    """Under tp the filter judges each rank's matmul: at tp 4 this shape's k and v keep
    bf16 (8 columns a rank), as :func:`shardlab.estimate.fp8.tp_fp8_linears` counts them."""
    shape = ModelShape("t", 2, 64, 8, garden_vocab().size, 32, kv_heads=4, d_ff=128,
                       style="llama", tied=False)
    for tp in (1, 2, 4):
        model = TransformerLM(shape)
        names = fp8.convert_fp8_linears(model, tp=tp)
        block = {n.split(".", 2)[2] for n in names if n.startswith("blocks.0.")}
        assert block == tp_fp8_linears(shape, tp), tp
