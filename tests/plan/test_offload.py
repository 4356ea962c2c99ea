"""Activation offloading to host memory (plan/offload.py, ``--layout offload_layers=N``)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from shardlab.cli import main
from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import Accelerator, Link, get_accelerator
from shardlab.errors import SpecError
from shardlab.plan.offload import check_offload, offload_seconds
from shardlab.plan.options import check_trainable, step_options_for
from shardlab.plan.rules import R_OFFLOAD
from shardlab.plan.search import layout_candidates, plan
from shardlab.plan.space import Space

GB200 = get_accelerator("gb200")
MODEL = get_model("llama-3-8b")  # 32 layers
SPACE = Space(gpus=8, global_batch=16, seq=8192, gpus_per_node=72)
LAYOUT = "dp=8 tp=1 pp=1 zero=1 micro_batch=2 recompute=none"


def _best(acc: Accelerator, n: int, layout: str = LAYOUT) -> dict:
    keys = {"offload_layers": str(n)} if n else {}
    opts = step_options_for(acc, flash=True, framework="megatron", overrides=keys)
    only = layout_candidates(MODEL, SPACE, layout)
    return plan(MODEL, acc, SPACE, get_policy("bf16"), only=only, options=opts).best[0]


def test_exposed_is_what_the_copy_takes_beyond_its_window() -> None:
    link = Link("slow", 10e9, 0.0)
    # 4 of 32 layers, 8 GB offloaded: 2 GB per layer, 0.2 s each way at 10 GB/s; the window
    # is 32/4 = 8 layers: forward 8 x 10 ms = 0.08 s, backward 8 x 20 ms = 0.16 s.
    exposed, hidden = offload_seconds(np.array([8e9]), 4, 32, np.array([0.01]),
                                      np.array([0.02]), link, 1.0)
    assert exposed[0] == pytest.approx(4 * ((0.2 - 0.08) + (0.2 - 0.16)), rel=1e-12)
    assert hidden[0] == pytest.approx(2 * 4 * 0.2 - exposed[0], rel=1e-12)
    none, _ = offload_seconds(np.array([8e9]), 4, 32, np.array([1.0]), np.array([2.0]),
                              link, 1.0)
    assert none[0] == 0.0


def test_offloaded_layers_leave_the_device_and_hide_behind_compute_on_gb200() -> None:
    base, off = _best(GB200, 0), _best(GB200, 8)
    act0 = base["memory_breakdown"]["activations"]
    moved = off["memory_breakdown"]["offloaded_to_host"]
    assert off["memory_breakdown"]["activations"] + moved == pytest.approx(act0, rel=1e-12)
    # The layers' share: 8 of 32 layers' activations (the head's logits stay).
    assert 0.2 * act0 < moved < 0.25 * act0
    # NVLink-C2C's 225 GB/s per direction hides the copies: the step does not change.
    assert off["step_seconds"] == pytest.approx(base["step_seconds"], rel=1e-12)
    assert off["hidden"]["offload"] > 0 and off["breakdown"]["offload"] == 0.0


def test_a_slow_host_link_exposes_the_copies() -> None:
    slow = replace(GB200, host_link=Link("slow", 2e9, 0.0))
    base, off = _best(slow, 0), _best(slow, 8)
    assert off["breakdown"]["offload"] > 0
    assert off["step_seconds"] == pytest.approx(base["step_seconds"]
                                                + off["breakdown"]["offload"], rel=1e-9)


def test_a_search_keeps_only_layouts_megatron_can_offload() -> None:
    opts = step_options_for(GB200, flash=True, framework="megatron",
                            overrides={"offload_layers": "4"})
    p = plan(MODEL, GB200, Space(gpus=16, global_batch=32, seq=8192, gpus_per_node=72),
             get_policy("bf16"), top=10, options=opts)
    assert p.rejected.get(R_OFFLOAD, 0) > 0
    assert all(b["pp"] == 1 and b["recompute"] == "none" for b in p.best)


@pytest.mark.parametrize(("layout", "gpu", "words"), [
    ("dp=4 pp=2 micro_batch=1 recompute=none offload_layers=4", "gb200", "pp=1"),
    ("dp=8 micro_batch=1 recompute=full offload_layers=4", "gb200", "recompute=none"),
    ("dp=8 micro_batch=1 recompute=none offload_layers=32", "gb200", "below"),
    ("dp=8 micro_batch=1 recompute=none offload_layers=two", "gb200", "whole number"),
])
def test_bad_offload_is_one_line(capsys: pytest.CaptureFixture[str], layout: str, gpu: str,
                                 words: str) -> None:
    code = main(["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16", "--gpu", gpu,
                 "--layout", layout])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "offload_layers" in err and words in err


def test_plan_json_and_table_show_the_host_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16", "--gpu", "gb200",
            "--framework", "megatron", "--layout", LAYOUT + " offload_layers=8"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"][0]["memory_breakdown"]["offloaded_to_host"] > 0
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "offloaded to host memory" in text and "offload hidden" in text


def test_offload_is_refused_where_shardlab_train_runs_the_layout(
        capsys: pytest.CaptureFixture[str]) -> None:
    # shardlab train offloads nothing: a dry run or a job file of such a layout would not be
    # the layout priced.
    code = main(["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16", "--gpu", "gb200",
                 "--dry-run-top", "1", "--layout", "offload_layers=4"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "offload_layers" in err


def test_offload_is_megatrons_and_zero_is_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16", "--gpu", "gb200"]
    assert main([*argv, "--framework", "torchtitan", "--layout", "offload_layers=4"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "torchtitan" in err
    # offload_layers=00 is none: a dry run may take it.
    check_trainable({"offload_layers": "00", "optimizer_dtype": "FP32"})
    # A device with no host link to copy over (a hardware file may leave it out).
    with pytest.raises(SpecError, match="host link"):
        check_offload(4, 32, None, "X1")
