"""`shardlab plan`: the JSON contract, the human view, this machine's train command, bad input."""

import argparse
import json
import shlex
from pathlib import Path

import pytest

from shardlab.calibrate.store import save_measurement
from shardlab.cli import build_parser, main
from shardlab.cli.plan import add_plan_args, plan_document
from shardlab.config.measured import SCHEMA
from shardlab.errors import SpecError

BEST_KEYS = {"dp", "tp", "pp", "virtual_stages", "micro_batch", "microbatches", "zero", "sp",
             "recompute", "schedule", "step_seconds", "mfu", "memory_per_device", "breakdown",
             "memory_breakdown", "train_command"}


GB8 = ["--global-batch", "8"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_document_has_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "llama-3-70b", "--gpu", "h100", "--gpus", "64", "--seq", "4096",
                       "--global-batch", "128", "--top", "3", "--json")
    assert code == 0
    doc = json.loads(out)
    for k in ("model", "gpu", "gpus", "seq", "global_batch", "candidates_evaluated", "feasible",
              "rejected", "best", "seconds"):
        assert k in doc
    assert doc["gpu"] == "H100 SXM" and doc["gpus"] == 64 and len(doc["best"]) == 3
    assert doc["feasible"] + sum(doc["rejected"].values()) == doc["candidates_evaluated"]
    for b in doc["best"]:
        assert set(b) >= BEST_KEYS
        assert set(b["breakdown"]) >= {"compute", "recompute", "tp_comm", "dp_comm", "pp_comm",
                                       "bubble"}
        assert set(b["memory_breakdown"]) >= {"weights", "gradients", "optimizer",
                                              "activations"}
        assert b["train_command"] is None  # not this machine
        mb = b["memory_breakdown"]
        assert b["memory_per_device"] == pytest.approx(
            mb["weights"] + mb["gradients"] + mb["optimizer"] + mb["activations"])


def test_layout_flag_evaluates_that_layout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "llama-3-70b", "--gpus", "64", "--seq", "4096", "--global-batch",
                       "128", "--layout", "dp=1 tp=8 pp=8 virtual=2 micro_batch=1 zero=1 sp=1 "
                       "recompute=selective schedule=interleaved-1f1b", "--json")
    assert code == 0
    b = json.loads(out)["best"][0]
    assert (b["dp"], b["tp"], b["pp"], b["virtual_stages"], b["zero"], b["sp"],
            b["recompute"], b["schedule"]) == (1, 8, 8, 2, 1, True, "selective",
                                               "interleaved-1f1b")
    assert b["microbatches"] == 128


def test_human_view(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "llama-3-8b", "--gpus", "16", "--seq", "2048", "--global-batch",
                       "64", "--top", "2")
    assert code == 0
    assert "Fastest layouts" in out and "Rejected" in out and "layouts/s" in out
    assert "run it:" not in out


@pytest.mark.parametrize(("argv", "field"), [
    (["llama-3-8b", "--gpu", "h900", "--gpus", "8", "--global-batch", "8"], "gpu="),
    (["llama-3-8b", "--gpus", "7", "--global-batch", "8", "--max-pp", "4"], "gpus=7"),
    (["llama-3.1-405b", "--gpus", "8", "--global-batch", "8", "--seq", "8192"],
     "smallest needs"),
    (["llama-3-8b", "--gpus", "24", "--global-batch", "8", "--layout", "tp=3"], "tp=3"),
    (["llama-3-8b", "--gpus", "8", "--zero", "5", *GB8], "zero=5"),
    # Once silently sp=0, the last dp, 25 s to minutes of silence, an OSError, and a
    # model called 'flags' the user never named.
    (["llama-3-8b", "--gpus", "8", "--layout", "tp=2 sp=banana", *GB8], "sp='banana': must"),
    (["llama-3-8b", "--gpus", "8", "--layout", "dp=8 dp=4", *GB8], "given twice"),
    # Once one silently won: a search flag beside one layout, a flag against a key.
    (["llama-3-8b", "--gpus", "8", "--cp", "2", "--layout", "cp=4", *GB8],
     "cp='2': searches layouts, and --layout prices one"),
    (["llama-3-8b", "--gpus", "8", "--max-tp", "2", "--layout", "tp=8", *GB8], "max_tp=2"),
    (["llama-3-8b", "--gpus", "8", "--no-overlap-dp", "--layout", "overlap_dp=on", *GB8],
     "overlap_dp='on': is given by --layout and by --no-overlap-dp"),
    (["llama-3-8b", "--gpus", "8", "--attention", "eager", "--layout", "flash_kernel=fa3",
      *GB8], "flash_kernel='fa3': names a fused attention kernel"),
    # Once misleading or silent: HSDP without ZeRO, sp=True, an empty dtype, micro-batch 0.
    (["llama-3-8b", "--gpus", "8", "--dp-replicate", "2", "--zero", "0", *GB8],
     "dp_replicate='2': needs ZeRO >= 1"),
    (["llama-3-8b", "--gpus", "8", "--layout", "sp=1 tp=1", *GB8], "sp=1: sequence parallel"),
    (["llama-3-8b", "--gpus", "8", "--dtype", "", *GB8], "dtype='': must be one of"),
    (["llama-3-8b", "--gpus", "8", "--micro-batches", "0", *GB8], "micro_batches=0"),
    # A zero degree once divided the default dp by zero (a traceback).
    (["llama-3-8b", "--gpus", "8", "--layout", "tp=0", *GB8], "tp=0: must be a positive"),
    (["llama-3-8b", "--gpus", "8", "--layout", "pp=0", *GB8], "pp=0: must be a positive"),
    (["llama-3-8b", "--gpus", "8", "--layout", "cp=0", *GB8], "cp=0: must be a positive"),
    (["--gpus", "1e9", *GB8], "gpus=1000000000: must be <= 1,048,576 (2^20)"),
    (["--gpus", "1e30", *GB8], "(2^20)"),
    (["--layers", "1000000", "--gpus", "8", *GB8], "layers=1000000: must be <= 4,096"),
    (["x" * 100000, "--gpus", "8", *GB8], "more characters"),
    (["--d-model", "65536", "--layers", "200", "--gpus", "8", *GB8],
     "shape flags='llama L=200 d=65536"),
    (["--layers", "4096", "--gpus", "720720", "--global-batch", "720720", "--max-tp", "720720"],
     "layouts="),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                      field: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and field in err and err.startswith("shardlab plan: error:")
    assert len(err) < 300 and "'flags'" not in err


def test_top_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    # --top 100000 once drew a table for more than a minute.
    with pytest.raises(SystemExit) as stop:
        main(["plan", "llama-3-8b", "--gpus", "8", "--top", "100000", *GB8])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--top: '100000' must be at most 1,000" in err


def test_budget_and_plan_give_a_layout_the_same_memory(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Budget once defaulted to eager attention (315.7 GB of activations), plan to flash.
    assert main(["budget", "llama-3-8b", "--gpus", "8", "--zero", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    code, out, err = run(capsys, "llama-3-8b", "--gpus", "8", "--layout", "dp=8 zero=3",
                         "--json", *GB8)
    assert code == 0, err
    best = json.loads(out)["best"][0]
    assert doc["assumptions"]["attention"] == "flash"
    assert best["memory_per_device"] == doc["memory"]["per_device"]["total"]
    assert best["memory_breakdown"]["activations"] == doc["memory"]["per_device"]["activations"]
    defaults = {c: build_parser().parse_args([c, "--gpus", "8", *GB8]).attention
                for c in ("budget", "plan")}
    assert defaults == {"budget": "flash", "plan": "flash"}


def test_a_deep_model_on_many_devices_is_searched(capsys: pytest.CaptureFixture[str]) -> None:
    # 4,096 layers (the limit): once minutes of silence (a Python step per layer, and
    # zero-bubble schedules simulated 1,024 stages deep); now well under a second.
    code, out, err = run(capsys, "--layers", "4096", "--gpus", "1024", "--global-batch",
                         "2048", "--top", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["candidates_evaluated"] > 30_000 and doc["best"][0]["fits"]


def test_this_machine_hands_over_a_train_command(capsys: pytest.CaptureFixture[str],
                                                 cpu_home: Path) -> None:
    code, out, _ = run(capsys, "--gpu", "cpu", "--gpus", "2", "--global-batch", "8",
                       "--top", "50", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["this_machine"] and doc["seq"] == 32
    for b in doc["best"]:
        assert b["zero"] in (0, 2, 3)
        assert b["schedule"] in ("gpipe", "1f1b", "interleaved-1f1b")
        argv = shlex.split(b["train_command"])
        assert argv[:2] == ["shardlab", "train"]
        args = build_parser().parse_args(argv[1:])  # every flag is one train knows
        assert (args.dp, args.tp, args.pp, args.global_batch, args.micro_batch, args.seq) == (
            b["dp"], b["tp"], b["pp"], 8, b["micro_batch"], 32)
        assert args.dp_mode == ("fsdp" if b["dp"] == 1 else
                                {0: "ddp", 2: "fsdp-zero2", 3: "fsdp"}[b["zero"]])
        assert not (args.dp_mode == "ddp" and args.tp > 1)
    code, out, _ = run(capsys, "--gpu", "cpu", "--gpus", "2", "--global-batch", "8")
    assert code == 0 and "run it: shardlab train --style llama" in out


def test_add_plan_args_and_plan_document_for_other_commands(cpu_home: Path) -> None:
    p = argparse.ArgumentParser()
    add_plan_args(p)
    args = p.parse_args(["gpt2", "--gpus", "4", "--global-batch", "16", "--seq", "512"])
    doc = plan_document(args)
    assert doc["model"] == "gpt2" and doc["best"] and "seconds" in doc
    with pytest.raises(SpecError):
        plan_document(p.parse_args(["gpt2", "--gpus", "4", "--global-batch", "16", "--gpu",
                                    "nope"]))


def test_an_emulated_bf16_is_planned_slow_and_said(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU whose bf16 matmul is torch's emulated kernel (1.6 GFLOP/s, fp32 100): the plan
    in bf16 is priced at that rate and says fp32 is the fast path; in fp32 it says nothing."""
    from shardlab.cli.train import dtype_note
    from shardlab.config.measured import load_measurement

    monkeypatch.setenv("SHARDLAB_HOME", str(tmp_path))
    save_measurement({"schema": SCHEMA, "name": "cpu (measured)",
                      "peak_flops": {"fp32": 1e11, "bf16": 1.6e9}, "memory_bytes": 8e9,
                      "memory_bandwidth": 2e10, "copy_bandwidth": 1e10, "power_watts": 0,
                      "threads": 2, "kernels": {"fp32": "native", "bf16": "emulated"}})
    assert load_measurement().emulated == ("bf16",)
    docs = {}
    for dtype in ("fp32", "bf16"):
        code, out, _ = run(capsys, "--gpu", "cpu", "--gpus", "2", "--global-batch", "8",
                           "--dtype", dtype, "--json")
        assert code == 0
        docs[dtype] = json.loads(out)
    assert docs["fp32"]["notes"] == []
    (note,) = docs["bf16"]["notes"]
    assert "emulated" in note and "x0.016 of fp32" in note and "fp32 is the fast path" in note
    assert docs["bf16"]["best"][0]["step_seconds"] > 5 * docs["fp32"]["best"][0]["step_seconds"]
    code, out, _ = run(capsys, "--gpu", "cpu", "--gpus", "2", "--global-batch", "8",
                       "--dtype", "bf16")
    assert code == 0 and "note: bf16 matmuls run torch's emulated kernel" in out
    # shardlab train says the same before it starts, for this machine only.
    assert dtype_note("bf16", None) == note and dtype_note("bf16", "cpu") == note
    assert dtype_note("fp32", None) is None and dtype_note("bf16", "h100") is None


def test_shape_flags_beside_a_model_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A shape flag with MODEL used to be ignored without a word (issue 21, finding 17)."""
    code, out, err = run(capsys, "llama-3-8b", "--gpus", "8", "--global-batch", "8",
                         "--layers", "4")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--layers cannot be combined with MODEL (llama-3-8b)" in err
    code, out, _ = run(capsys, "--gpus", "2", "--global-batch", "8", "--layers", "2",
                       "--json")
    assert code == 0 and json.loads(out)["model_shape"].startswith("llama L=2 ")


def test_a_given_layout_that_does_not_fit_gets_the_changes_that_make_it_fit(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("llama-3-8b", "--gpus", "8", "--seq", "8192", "--global-batch", "64")
    code, out, err = run(capsys, *argv, "--layout", "dp=8 micro_batch=8 zero=0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    fit, given = doc["fit"], doc["best"][0]
    assert not given["fits"] and fit["binding"] == "activations"
    assert fit["capacity"] == doc["usable_memory_per_device"]  # plan's verdict: 90% of 80 GB
    assert fit["memory_bytes"] == given["memory_per_device"]
    assert fit["step_seconds"] == pytest.approx(given["step_seconds"], rel=1e-12)
    for c in [*fit["changes"], *fit["pairs"]]:
        assert set(c) >= {"change", "memory_bytes", "fits", "step_seconds", "step_ratio"}
    pair = fit["pairs"][0]
    assert pair["change"] == "zero=3 recompute=full" and pair["fits"]
    # The pair's layout, given to plan, is priced the same.
    lay = pair["layout"]
    text = " ".join(f"{k}={int(lay[k]) if k == 'sp' else lay[k]}" for k in
                    ("dp", "tp", "pp", "zero", "sp", "micro_batch", "recompute", "schedule"))
    code, out, _ = run(capsys, *argv, "--layout", text, "--json")
    again = json.loads(out)
    assert again["fit"] is None and again["best"][0]["fits"]
    assert again["best"][0]["step_seconds"] == pytest.approx(pair["step_seconds"], rel=1e-12)
    assert again["best"][0]["memory_per_device"] == pair["memory_bytes"]
    code, out, _ = run(capsys, *argv, "--layout", "dp=8 micro_batch=8 zero=0")
    assert code == 0 and "What binds: activations" in out and "To make it fit" in out


def test_a_search_has_no_fit_advice(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "llama-3-8b", "--gpus", "8", "--top", "1", "--json", *GB8)
    assert code == 0 and json.loads(out)["fit"] is None


def test_this_machine_advises_only_what_train_runs(capsys: pytest.CaptureFixture[str],
                                                   cpu_home: Path) -> None:
    code, out, err = run(capsys, "--gpu", "cpu", "--gpus", "2", "--global-batch", "8",
                         "--d-model", "4096", "--layers", "8", "--heads", "32",
                         "--layout", "dp=2 zero=0 micro_batch=4", "--json")
    assert code == 0, err
    fit = json.loads(out)["fit"]
    assert fit is not None and fit["capacity"] == 0.9 * 8e9 / 2
    tried = [c["layout"] for c in [*fit["changes"], *fit["pairs"]]]
    assert tried and all(lay["zero"] in (0, 2, 3) for lay in tried)
    assert all(not (lay["zero"] == 0 and lay["dp"] > 1 and lay["tp"] > 1) for lay in tried)


def test_a_plan_states_the_held_out_error_of_runs_like_it(
        capsys: pytest.CaptureFixture[str], cpu_home: Path) -> None:
    argv = ["llama-3-70b", "--gpu", "h100", "--gpus", "256", "--global-batch", "512",
            "--dtype", "fp8", "--framework", "megatron", "--top", "1"]
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    doc = json.loads(out)
    acc = doc["accuracy"]
    names = [s["slice"] for s in acc["slices"]]
    assert acc["accelerator_held_out"] and {"H100/H200", "fp8", "Megatron-LM / NeMo"} <= set(
        names)
    assert ("pipeline parallel" in names) == (doc["best"][0]["pp"] > 1)
    fp8 = next(s for s in acc["slices"] if s["slice"] == "fp8")
    code, out, _ = run(capsys, *argv)
    text = " ".join(out.split())
    assert (f"fp8 {fp8['mean_abs_error']:.1%} over {fp8['runs']} runs "
            f"({fp8['mean_error']:+.1%} signed)") in text
    assert "held-out step-time error of published runs like this" in text
    # An accelerator with an assumed curve: its own error is unknown, and the line says so;
    # fp32 on a GPU: no held-out run ran in it.
    code, out, _ = run(capsys, "llama-3-8b", "--gpu", "mi300x", "--gpus", "8", *GB8, "--top",
                       "1")
    assert code == 0 and ("held-out step-time error: unknown on MI300X, whose efficiency "
                          "curve is assumed") in " ".join(out.split())
    code, out, _ = run(capsys, "llama-3-8b", "--gpu", "h100", "--gpus", "8", *GB8, "--dtype",
                       "fp32", "--top", "1")
    assert code == 0 and "none ran in fp32" in " ".join(out.split())
    # This machine's plan is priced on its own measurement: no published run speaks for it.
    code, out, _ = run(capsys, "--gpu", "cpu", "--gpus", "2", *GB8, "--json")
    assert code == 0 and json.loads(out)["accuracy"] is None


def test_megatron_on_gb200_says_which_attention_kernel_it_prices(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A 192-wide head (6144 / 32) on GB200: Transformer Engine runs FlashAttention-2 there.
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 6144,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 16384,
        "num_hidden_layers": 8, "vocab_size": 32000, "max_position_embeddings": 4096}))
    base = [str(cfg), "--gpu", "gb200", "--gpus", "8", *GB8, "--framework", "megatron",
            "--layout", "dp=8 tp=1 pp=1 micro_batch=1 zero=1 recompute=none", "--json"]
    code, out, _ = run(capsys, *base)
    doc = json.loads(out)
    assert code == 0 and doc["step_options"]["flash_kernel"] == "fa2"
    assert any("FlashAttention-2" in n and "head dim 192" in n for n in doc["notes"])
    # Naming cuDNN's kernel prices it, faster, and drops the note.
    base[-2] = "dp=8 tp=1 pp=1 micro_batch=1 zero=1 recompute=none flash_kernel=fa3"
    code, out, _ = run(capsys, *base)
    named = json.loads(out)
    assert code == 0 and named["step_options"]["flash_kernel"] == "fa3"
    assert not any("FlashAttention-2" in n for n in named["notes"])
    assert named["best"][0]["step_seconds"] < doc["best"][0]["step_seconds"]
