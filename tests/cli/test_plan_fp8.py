"""`shardlab plan` and `budget` with fp8, communication overlap, frameworks and the facts a
run states (NICs, power cap): the issue's figures and its bad input."""

from __future__ import annotations

import json
import time

import pytest
from tests.conftest import one_line_error, plan_json

from shardlab.cli import main

# torchtitan's async-TP benchmark (pytorch/torchtitan,
# benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, commit 2887250b): "Llama3 70b on 256
# H100s with FSDP=32, TP=8, torch.compile, full AC, local batch size 16", vanilla TP,
# "None (bfloat16) | 597.3" and "float8 tensorwise | 809.8" tokens/s per GPU, on the
# file's 96 GB HBM2e H100s at their "default 500W power limit".
MEASURED_FP8_SPEEDUP = 809.8 / 597.3  # 1.356
TORCHTITAN_70B = ["llama-3-70b", "--gpus", "256", "--global-batch", "512", "--seq", "8192",
                  "--framework", "torchtitan", "--power-cap-w", "500", "--layout",
                  "dp=32 tp=8 zero=3 sp=1 recompute=full micro_batch=16 fused_norm=1"]




def test_fp8_70b_on_256_h100_is_faster_than_bf16_by_the_measured_ratio(
        capsys: pytest.CaptureFixture[str]) -> None:
    bf16 = plan_json(capsys, *TORCHTITAN_70B, "--dtype", "bf16")
    fp8 = plan_json(capsys, *TORCHTITAN_70B, "--dtype", "fp8")
    ratio = bf16["best"][0]["step_seconds"] / fp8["best"][0]["step_seconds"]
    assert ratio == pytest.approx(MEASURED_FP8_SPEEDUP, rel=0.1)
    assert fp8["linear_peak_flops_per_device"] == pytest.approx(
        2 * fp8["peak_flops_per_device"], rel=0.01)  # 1979 against 989 TFLOP/s, capped alike
    assert any("CUDA" in n for n in fp8["notes"])
    # A search finds an fp8 layout faster than the best bf16 one too.
    search = ["llama-3-70b", "--gpus", "256", "--global-batch", "512", "--seq", "8192"]
    b = plan_json(capsys, *search, "--dtype", "bf16")["best"][0]["step_seconds"]
    f = plan_json(capsys, *search, "--dtype", "fp8")["best"][0]["step_seconds"]
    assert b / f > 1.2


def test_405b_on_16384_gpus_with_overlap_and_fp8_searches_in_3_s(
        capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    doc = plan_json(capsys, "llama-3.1-405b", "--gpus", "16384", "--global-batch", "2048",
                    "--seq", "8192", "--dtype", "fp8", "--framework", "megatron", "--layout",
                    "overlap_dp=1 overlap_tp=1 overlap_pp=1")
    assert time.perf_counter() - start < 3.0
    assert doc["candidates_evaluated"] > 10_000 and doc["layout_given"]
    o = doc["step_options"]
    assert (o["overlap_dp"], o["overlap_tp"], o["overlap_pp"]) == ("on", "on", "on")
    assert all(b["hidden"]["dp_comm"] >= 0 for b in doc["best"])


def test_overlap_keys_move_communication_from_exposed_to_hidden(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["llama-3-70b", "--gpus", "64", "--global-batch", "128", "--seq", "4096",
            "--layout", "dp=2 tp=8 pp=4 virtual=2 zero=1 sp=1 micro_batch=1"]
    off = plan_json(capsys, *base[:-1], base[-1] + " overlap_dp=0 overlap_tp=0 overlap_pp=0")
    on = plan_json(capsys, *base[:-1], base[-1] + " overlap_dp=1 overlap_tp=1 overlap_pp=1")
    b0, b1 = off["best"][0], on["best"][0]
    for part in ("tp_comm", "pp_comm", "dp_comm"):
        assert b0["hidden"][part] == pytest.approx(0.0, abs=1e-12)
        assert b1["breakdown"][part] < b0["breakdown"][part]
        # Exposed + hidden is the whole transfer, with or without overlap.
        assert b1["breakdown"][part] + b1["hidden"][part] == pytest.approx(
            b0["breakdown"][part], rel=1e-9)
    assert b1["step_seconds"] < b0["step_seconds"]


def test_frameworks_set_their_defaults_and_the_layout_overrides(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["llama-3-8b", "--gpus", "16", "--global-batch", "32", "--seq", "4096", "--top", "1"]
    meg = plan_json(capsys, *argv, "--framework", "megatron")["step_options"]
    tt = plan_json(capsys, *argv, "--framework", "torchtitan")["step_options"]
    ds = plan_json(capsys, *argv, "--framework", "deepspeed")["step_options"]
    assert (meg["overlap_dp"], meg["overlap_pp"], meg["fused_norm"]) == ("off", "interleaved",
                                                                         True)
    assert (tt["overlap_dp"], tt["fused_norm"], tt["flash_kernel"]) == ("on", False, "fa2")
    assert ds["overlap_dp"] == "zero3"
    assert "arguments.py" in meg["framework_source"]
    mine = plan_json(capsys, *argv, "--framework", "torchtitan", "--layout",
                     "overlap_tp=1 fused_norm=1")["step_options"]
    assert mine["overlap_tp"] == "forward" and mine["fused_norm"] is True  # async TP


def test_unfused_gradient_accumulation_costs_its_own_pass(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Megatron's --no-gradient-accumulation-fusion: each micro-batch after the first adds its
    # gradients in a pass of its own, 3 x the rank's gradient bytes at the memory bandwidth.
    argv = ["llama-3-8b", "--gpus", "8", "--global-batch", "32", "--seq", "4096",
            "--framework", "megatron", "--layout",
            "dp=2 pp=4 zero=1 micro_batch=1 recompute=none schedule=1f1b"]
    fused = plan_json(capsys, *argv[:-1], argv[-1] + " fused_accumulation=1")
    split = plan_json(capsys, *argv[:-1], argv[-1] + " fused_accumulation=0")
    assert fused["step_options"]["fused_accumulation"] is True
    assert split["step_options"]["fused_accumulation"] is False
    a, b = fused["best"][0], split["best"][0]
    params = b["memory_breakdown"]["weights"] / 2  # bf16 weights on the busiest rank
    pass_s = 3 * params * 2 / 3.35e12  # bf16 gradients at the H100's 3.35 TB/s
    extra = b["breakdown"]["compute"] - a["breakdown"]["compute"]
    assert extra == pytest.approx((b["microbatches"] - 1) * pass_s, rel=0.05)


def test_fp8_primary_weights_hold_two_bytes_and_gather_in_fp8(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Megatron's --fp8-param-gather (Transformer Engine's fp8_model_init): each linear weight
    # is its fp8 copy and fp8 transpose, no bf16 weight (4 B -> 2 B per element), and the
    # distributed optimizer's parameter all-gather moves 1 B per linear weight, not 2.
    argv = ["llama-3-8b", "--gpus", "16", "--global-batch", "32", "--seq", "4096",
            "--dtype", "fp8", "--framework", "megatron", "--layout"]
    lay = "dp=16 zero=1 micro_batch=1 recompute=full overlap_dp=0"
    plain = plan_json(capsys, *argv, lay)["best"][0]
    primary = plan_json(capsys, *argv, lay + " fp8_params=1")["best"][0]
    linear = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336)  # 8B's layers
    saved = plain["memory_breakdown"]["weights"] - primary["memory_breakdown"]["weights"]
    assert saved == pytest.approx(2 * linear, rel=1e-9)
    assert primary["breakdown"]["dp_comm"] < plain["breakdown"]["dp_comm"]
    # Only with fp8: one line, exit 2.
    bf16 = ["plan", "llama-3-8b", "--gpus", "16", "--global-batch", "32", "--layout",
            lay + " fp8_params=1"]
    assert main(bf16) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp8_params" in err[0] and "--dtype fp8" in err[0]


def test_megatron_holds_gradients_in_the_reduction_dtype(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Megatron-Core's DDP allocates its gradient buffer in float32 only with
    # grad_reduce_in_fp32; reduce_dtype=bf16 (grad_reduce_in_fp32 False) holds 2 B per
    # gradient, not the fp32 main_grad's 4.
    argv = ["llama-3-8b", "--gpus", "8", "--global-batch", "16", "--seq", "4096",
            "--framework", "megatron", "--layout"]
    lay = "dp=8 zero=1 micro_batch=1 recompute=full"
    fp32 = plan_json(capsys, *argv, lay)["best"][0]["memory_breakdown"]["gradients"]
    bf16 = plan_json(capsys, *argv, lay + " reduce_dtype=bf16")["best"][0]
    assert bf16["memory_breakdown"]["gradients"] == pytest.approx(fp32 / 2, rel=1e-12)
    titan = ["--framework", "torchtitan", "--layout", "dp=8 zero=3 micro_batch=1"]
    a = plan_json(capsys, *argv[:-3], *titan)["best"][0]["memory_breakdown"]["gradients"]
    b = plan_json(capsys, *argv[:-3], *titan[:-1], titan[-1] + " reduce_dtype=bf16")
    assert b["best"][0]["memory_breakdown"]["gradients"] == a  # FSDP2 keeps its own


@pytest.mark.parametrize(("key", "state"), [("fp32", 12), ("bf16_moments", 8), ("bf16", 4)])
def test_optimizer_dtype_sets_adams_state_bytes(capsys: pytest.CaptureFixture[str], key: str,
                                                state: int) -> None:
    # fp32 master + moments (12 B), Megatron's precision-aware bf16 moments beside the fp32
    # master (8 B), Apex DistributedFusedAdam in bf16 (4 B), sharded over dp by ZeRO-1.
    argv = ["llama-3-8b", "--gpus", "8", "--global-batch", "16", "--seq", "4096",
            "--framework", "megatron", "--layout"]
    lay = "dp=8 zero=1 micro_batch=1 recompute=full"
    base = plan_json(capsys, *argv, lay)["best"][0]["memory_breakdown"]["optimizer"]
    doc = plan_json(capsys, *argv, lay + f" optimizer_dtype={key}")
    assert doc["optimizer_bytes_per_param"] == state
    got = doc["best"][0]["memory_breakdown"]["optimizer"]
    assert got == pytest.approx(base * state / 12, rel=1e-12)


@pytest.mark.parametrize("extra", [["--layout", "optimizer_dtype=fp16"],
                                   ["--dtype", "fp32", "--layout", "optimizer_dtype=bf16"],
                                   ["--dry-run-top", "1", "--layout", "optimizer_dtype=bf16"]])
def test_optimizer_dtype_bad_input_is_one_line(capsys: pytest.CaptureFixture[str],
                                               extra: list[str]) -> None:
    err = one_line_error(capsys, ["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16",
                                  "--gpu", "h100", *extra])
    assert "optimizer_dtype" in err


def test_help_documents_the_overlap_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("overlap_dp", "overlap_tp", "overlap_pp", "fused_norm", "fused_accumulation",
                  "fp8_params", "optimizer_dtype", "--framework",
                  "--nics-per-node", "--nic-gbps", "--power-cap-w", "fp8"):
        assert words in text


def test_fewer_nics_and_a_power_cap_slow_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["llama-3-8b", "--gpus", "64", "--global-batch", "64", "--seq", "4096", "--layout",
            "dp=64 zero=3 micro_batch=1 overlap_dp=0"]
    base = plan_json(capsys, *argv)["best"][0]
    thin = plan_json(capsys, *argv, "--nics-per-node", "4", "--nic-gbps", "100")
    assert thin["inter_node_link"]["bandwidth"] == pytest.approx(400e9 / 8 / 8)
    # The bandwidth part of the exposed gathers grows 8x (50 GB/s a GPU against 6.25; the
    # rings leave each node over all its NICs either way), the latency part stays: with
    # NICs at half speed it grows 2x, so thin - base = 7 x (half - base).
    half = plan_json(capsys, *argv, "--nic-gbps", "200")["best"][0]
    assert thin["best"][0]["breakdown"]["dp_comm"] - base["breakdown"]["dp_comm"] == (
        pytest.approx(7 * (half["breakdown"]["dp_comm"] - base["breakdown"]["dp_comm"]),
                      rel=1e-6))
    capped = plan_json(capsys, *argv, "--power-cap-w", "500")
    assert capped["peak_flops_per_device"] == pytest.approx(989e12 * (500 / 700) ** (1 / 3))
    assert capped["best"][0]["breakdown"]["compute"] > base["breakdown"]["compute"]


@pytest.mark.parametrize(("argv", "words"), [
    (["plan", "llama-3-8b", "--gpu", "a100", "--gpus", "8", "--global-batch", "8", "--dtype",
      "fp8"], "dtype='fp8': A100 SXM 80GB has no fp8 matmul"),
    (["budget", "llama-3-8b", "--gpu", "a100", "--dtype", "fp8"],
     "dtype='fp8': A100 SXM 80GB has no fp8 matmul"),
    (["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "8", "--framework", "nemo"],
     "framework='nemo': must be one of megatron, torchtitan, fsdp, deepspeed"),
    (["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "8", "--layout",
      "overlap_tp=maybe"], "overlap_tp='maybe'"),
    (["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "8", "--nic-gbps", "0"],
     "--nic-gbps"),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                      words: str) -> None:
    assert words in one_line_error(capsys, argv)


def test_budget_fp8_holds_fp8_copies_and_runs_on_the_blended_peak(
        capsys: pytest.CaptureFixture[str]) -> None:
    def budget(*argv: str) -> dict:
        assert main(["budget", "llama-3-8b", "--tp", "8", "--seq", "4096", *argv,
                     "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    bf16, fp8 = budget("--dtype", "bf16"), budget("--dtype", "fp8")
    hw = fp8["hardware"]
    assert hw["linear_dtype"] == "fp8" and 0.8 < hw["linear_flop_share"] < 0.95
    assert bf16["hardware"]["effective_peak_flops"] < hw["effective_peak_flops"] < 2 * 989e12
    assert fp8["time"]["step_seconds"] < bf16["time"]["step_seconds"]
    extra = fp8["memory"]["per_device"]["weights"] - bf16["memory"]["per_device"]["weights"]
    # fp8 weight + transpose of every linear weight on the rank, and its scales (ZeRO 0).
    attn = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    assert extra == pytest.approx(32 * (2 * (attn + 3 * 4096 * 14336) / 8 + 36 * 4))
    zero3 = budget("--dtype", "fp8", "--zero", "3", "--dp", "2", "--gpus", "16")
    same = budget("--dtype", "bf16", "--zero", "3", "--dp", "2", "--gpus", "16")
    assert zero3["memory"]["per_device"]["weights"] == same["memory"]["per_device"]["weights"]


def test_fp8_and_stated_facts_are_refused_on_this_machine(
        capsys: pytest.CaptureFixture[str], cpu_home: object) -> None:
    plan = ["plan", "--gpu", "cpu", "--gpus", "2", "--global-batch", "8"]
    assert "fast only on CUDA GPUs" in one_line_error(capsys, [*plan, "--dtype", "fp8"])
    assert "fast only on CUDA GPUs" in one_line_error(
        capsys, ["budget", "--gpu", "cpu", "--params", "1e6", "--dtype", "fp8"])
    assert "power_cap_w" in one_line_error(capsys, [*plan, "--power-cap-w", "300"])


def test_fsdp1_backward_prefetch_is_refused_where_it_does_not_exist(
        capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    job = ["llama-3-8b", "--gpus", "64", "--global-batch", "256"]
    layout = "dp=64 zero=3 backward_prefetch=post"
    doc = plan_json(capsys, *job, "--layout", layout)
    assert doc["step_options"]["backward_prefetch"] == "post"
    err = one_line_error(capsys, ["plan", *job, "--framework", "torchtitan", "--layout",
                                  layout])
    assert "backward_prefetch='post': post is PyTorch FSDP1's" in err
    # shardlab train runs FSDP2, which prefetches: a job file keeps to that.
    err = one_line_error(capsys, ["plan", *job, "--layout", layout, "--emit-config",
                                  str(tmp_path / "job.toml")])
    assert "backward_prefetch='post': is not what shardlab train runs" in err
    assert not (tmp_path / "job.toml").exists()
