"""``shardlab train --config job.toml`` and ``shardlab plan --emit-config``: every train flag
is a key, the command line overrides the file, the plan's file reads back to the same
TrainConfig as the plan's train command, bad files are one line naming the key and its
section, and the TOML writer reads back through ``tomllib`` (no torch, no rank started)."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardlab.cli import build_parser, main
from shardlab.cli.job_file import SECTIONS, toml_text
from shardlab.cli.train import check


def train_config(*argv: str) -> object:
    """train's TrainConfig for ARGV, every check made (none starts a rank)."""
    return check(build_parser().parse_args(["train", *argv]))[0]


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    return err.strip()


def train_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def test_every_train_flag_is_a_key_of_one_of_five_sections() -> None:
    p = train_parser()
    keys = p.get_default("job_keys")
    shown = {a.dest for a in p._actions if a.help != argparse.SUPPRESS} - {"help", "json",
                                                                            "config"}
    assert set(keys) == shown and {k.section for k in keys.values()} == set(SECTIONS)
    assert (keys["model"].section, keys["model"].name) == ("model", "name")
    assert (keys["data"].section, keys["data"].name) == ("data", "source")
    assert keys["checkpoint_dir"].section == "checkpoint" and keys["dp"].section == "layout"
    names = [(k.section, k.name) for k in keys.values()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("layout", [["--gpus", "4"], ["--gpus", "2", "--layout",
                                                       "dp=2 zero=2 micro_batch=2"]])
def test_the_plans_file_reads_back_to_its_train_commands_config(
        capsys: pytest.CaptureFixture[str], cpu_home: Path, layout: list[str]) -> None:
    job = cpu_home / "job.toml"
    code = main(["plan", "--gpu", "cpu", *layout, "--global-batch", "8", "--emit-config",
                 str(job), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"wrote {job}" in err
    argv = shlex.split(json.loads(out)["best"][0]["train_command"])[2:]
    assert train_config("--config", str(job)) == train_config(*argv)
    doc = tomllib.loads(job.read_text())
    assert list(doc) == list(SECTIONS) and "gpu" not in doc["run"]  # this CPU, measured


def test_a_gpu_plans_file_names_the_accelerator_and_a_layout_train_runs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    job = tmp_path / "8b.toml"
    code = main(["plan", "llama-3-8b", "--gpu", "h100", "--gpus", "64", "--seq", "4096",
                 "--global-batch", "256", "--emit-config", str(job), "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("{") and f"wrote {job}" in err
    doc = tomllib.loads(job.read_text())
    assert doc["model"] == {"name": "llama-3-8b"} and doc["run"]["gpu"] == "H100 SXM"
    assert doc["run"]["dtype"] == "bf16" and doc["layout"]["dp_mode"] in ("fsdp", "fsdp-zero2",
                                                                          "ddp")
    lay = doc["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] == 64
    cfg = train_config("--config", str(job), "--allow-oversubscribe")
    assert (cfg.dp, cfg.tp, cfg.pp, cfg.seq, cfg.global_batch) == (
        lay["dp"], lay["tp"], lay["pp"], 4096, 256)


def test_an_fp8_plans_file_runs_torchaos_fp8(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    """``--dtype fp8 --emit-config``: a dense model's file keeps the planner's tensor
    parallelism (train's fp8 linears take torchao's float8 styles), names fp8, and train
    reads it back: on this CPU refused without a CUDA device, and with --fp8-on-cpu, as
    the winner gathers its sequence in fp8 (tp > 1 with sp), refused for gloo."""
    plan = ["plan", "llama-3-70b", "--gpu", "h100", "--gpus", "64", "--seq", "4096",
            "--global-batch", "256", "--dtype", "fp8"]
    assert main([*plan, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"][0]
    assert best["tp"] > 1 and best["sp"]
    job = tmp_path / "70b.toml"
    assert main([*plan, "--emit-config", str(job)]) == 0
    text = " ".join("".join(capsys.readouterr()).split())
    assert "keeps tp=1" not in text and f"wrote {job}" in text
    doc = tomllib.loads(job.read_text())
    assert doc["run"]["dtype"] == "fp8" and doc["layout"]["tp"] > 1
    assert "no CUDA device" in refused(capsys, "train", "--config", str(job),
                                        "--allow-oversubscribe")
    assert "gloo cannot send" in refused(capsys, "train", "--config", str(job),
                                         "--fp8-on-cpu", "--allow-oversubscribe")


@pytest.mark.parametrize(("zero", "gathers"), [(3, True), (2, False)])
def test_an_fp8_zero3_file_gathers_in_fp8_as_planned(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path, zero: int,
                                                     gathers: bool) -> None:
    """The planner prices an fp8 run's ZeRO-3 weight gathers at 1 byte (plan/dp_time.py):
    its file runs them so (train's ``--fp8-all-gather``); ZeRO-2 gathers bf16 weights
    in both."""
    job = tmp_path / "job.toml"
    code = main(["plan", "llama-3-8b", "--gpu", "h100", "--gpus", "64", "--seq", "8192",
                 "--global-batch", "256", "--dtype", "fp8",
                 "--layout", f"dp=64 zero={zero} recompute=full",
                 "--emit-config", str(job)])
    capsys.readouterr()
    assert code == 0 and tomllib.loads(job.read_text())["run"]["fp8_all_gather"] is gathers
    cfg = train_config("--config", str(job), "--fp8-on-cpu", "--allow-oversubscribe")
    assert cfg.fp8_all_gather is gathers  # type: ignore[attr-defined]


@pytest.mark.parametrize(("framework", "recompute"), [([], "selective"),
                                                     (["--framework", "torchtitan"], "op")])
def test_torchtitans_selective_recompute_is_written_per_operator(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, framework: list[str],
        recompute: str) -> None:
    """A plan priced as torchtitan runs (its selective recompute is per-operator
    checkpointing) writes ``recompute = "op"``, train's per-operator checkpointing; without
    the framework, Korthikanti's selective."""
    job = tmp_path / "job.toml"
    code = main(["plan", "llama-3-8b", "--gpu", "h100", "--gpus", "64", "--seq", "8192",
                 "--global-batch", "256", "--recompute", "selective", *framework,
                 "--emit-config", str(job)])
    capsys.readouterr()
    assert code == 0 and tomllib.loads(job.read_text())["layout"]["recompute"] == recompute
    assert train_config("--config", str(job), "--allow-oversubscribe").recompute == recompute


def test_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[layout]\ndp = 2\nsp = true\ntp = 2\n[run]\nsteps = 7\nlr = 1\n'
                   '[data]\nsource = "garden"\n')
    cfg = train_config("--config", str(job), "--steps", "3", "--no-sp")
    assert (cfg.dp, cfg.tp, cfg.sp, cfg.steps, cfg.lr) == (2, 2, False, 3, 1.0)
    assert train_config("--config", str(job)).sp
    # a flag given at its default still beats the file
    assert train_config("--config", str(job), "--dp", "1").dp == 1
    assert train_config("--config", str(job), "--dp", "1") == train_config(
        "--dp", "1", "--tp", "2", "--sp", "--steps", "7", "--lr", "1")


def test_expert_parallel_keys_in_the_file(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    """``--ep``, ``--etp`` and ``--capacity-factor`` are [layout] keys, the MoE loss weights
    [run] keys, the shape [model] keys; a bad expert layout in the file is one line."""
    keys = train_parser().get_default("job_keys")
    assert {keys[k].section for k in ("ep", "etp", "capacity_factor")} == {"layout"}
    assert {keys[k].section for k in ("aux_loss_coef", "router_z_loss")} == {"run"}
    assert keys["experts"].section == "model"
    job = tmp_path / "job.toml"
    job.write_text("[model]\nexperts = 8\ntop_k = 2\n[layout]\ndp = 2\nep = 2\n"
                   "capacity_factor = 1.25\n[run]\naux_loss_coef = 0.02\n")
    cfg = train_config("--config", str(job))
    assert (cfg.dp, cfg.ep, cfg.capacity_factor, cfg.aux_coef) == (2, 2, 1.25, 0.02)
    assert train_config("--config", str(job), "--ep", "1").ep == 1
    job.write_text("[model]\nexperts = 8\n[layout]\ndp = 2\nep = 3\n")
    assert "ep=3" in refused(capsys, "train", "--config", str(job))


@pytest.mark.parametrize(("text", "needles"), [
    ("[layout]\ndpp = 2\n", ["layout.dpp=2", "unknown key in [layout]", "keys: dp, tp"]),
    ("[layout]\nsteps = 2\n", ["layout.steps=2", "it belongs in [run]"]),
    ("[layout]\ndp = \"2\"\n", ["layout.dp='2'", "must be an integer"]),
    ("[layout]\nsp = 1\n", ["layout.sp=1", "must be true or false"]),
    ("[layout]\ndp = 0\n", ["layout.dp=0", "must be a positive integer"]),
    ("[layout]\ndp_mode = \"zero3\"\n", ["layout.dp_mode='zero3'", "fsdp, fsdp-zero2, ddp"]),
    ("[run]\nlr = -1e-3\n", ["run.lr=-0.001", "finite number > 0"]),
    ("[run]\nsteps = [1]\n", ["run.steps=[1]", "must be an integer"]),
    ("dp = 2\n", ["dp=2", "outside any section", "under [layout]"]),
    ("[layot]\ndp = 2\n", ["[layot] is not a section", "model, layout, run, checkpoint, data"]),
    ("[layout]\ndp = \n", ["is not TOML", "line 2"]),
    ("[layout.extra]\ndp = 2\n", ["layout.extra", "unknown key in [layout]"]),
])
def test_a_bad_file_is_one_line_naming_the_key_and_its_section(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str,
        needles: list[str]) -> None:
    job = tmp_path / "job.toml"
    job.write_text(text)
    logs = tmp_path / "logs"
    err = refused(capsys, "train", "--config", str(job), "--log-dir", str(logs))
    assert err.startswith("shardlab train: error: ")
    for needle in needles:
        assert needle in err, err
    assert not logs.exists()


def test_emit_config_refuses_before_the_search_and_writes_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = ["plan", "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "64"]
    err = refused(capsys, *plan, "--emit-config", str(tmp_path / "no" / "job.toml"))
    assert "emit_config=" in err and "does not exist" in err
    err = refused(capsys, *plan, "--emit-config", str(tmp_path))
    assert "emit_config=" in err and "not a folder" in err
    # a --layout that does not fit: no winner to write
    err = refused(capsys, *plan, "--layout", "dp=8", "--emit-config", str(tmp_path / "j.toml"))
    assert "no layout that fits" in err
    err = refused(capsys, *plan, "--dtype", "fp16", "--emit-config", str(tmp_path / "j.toml"))
    assert "dtype" in err
    assert list(tmp_path.iterdir()) == []


SCALARS = (st.booleans() | st.integers(-(2**63), 2**63 - 1)
           | st.floats(allow_nan=False) | st.text())
NAMES = st.text(min_size=1, max_size=8)


@given(st.dictionaries(NAMES, st.dictionaries(NAMES, SCALARS, max_size=4), max_size=3),
       st.lists(st.text(max_size=40), max_size=2))
def test_toml_text_reads_back_through_tomllib(sections: dict[str, dict[str, object]],
                                              header: list[str]) -> None:
    back = tomllib.loads(toml_text(sections, header))
    assert back == sections
    for name, table in sections.items():  # floats bit for bit, -0.0 and inf included
        for key, value in table.items():
            if isinstance(value, float):
                assert math.copysign(1, back[name][key]) == math.copysign(1, value)
