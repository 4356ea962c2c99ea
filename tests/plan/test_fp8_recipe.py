"""The Transformer Engine fp8 recipe a run names (``--layout fp8_recipe=``): its casts' bytes
(estimate/fp8.py RECIPE_CAST_BYTES), what it refuses, and the published rows that state one."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from shardlab.cli import main
from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.errors import SpecError
from shardlab.estimate.fp8 import RECIPE_CAST_BYTES
from shardlab.plan.options import step_options_for
from shardlab.plan.published import RUNS
from shardlab.plan.search import layout_candidates, plan
from shardlab.plan.space import Space

H100 = get_accelerator("H100 SXM")
MODEL = get_model("llama-3-8b")
SPACE = Space(gpus=8, global_batch=16, seq=8192)
LAYOUT = "dp=8 tp=1 pp=1 zero=1 micro_batch=2 recompute=none"


def _priced(recipe: str | None, dtype: str = "fp8") -> dict:
    keys = {"fp8_recipe": recipe} if recipe else {}
    opts = step_options_for(H100, flash=True, framework="megatron", overrides=keys)
    only = layout_candidates(MODEL, SPACE, LAYOUT)
    return plan(MODEL, H100, SPACE, get_policy(dtype), only=only, options=opts).best[0]


def test_a_recipe_sets_the_casts_bytes_and_nothing_else() -> None:
    # Delayed scaling 3 B, current (tensorwise) scaling 5 B, MXFP8 4 B (estimate/fp8.py).
    assert RECIPE_CAST_BYTES == {"delayed": 3, "tensorwise": 5, "mxfp8": 4}
    plain = step_options_for(H100, flash=True, framework="megatron")
    assert (plain.fp8_recipe, plain.fp8_cast_bytes) == ("", 3)  # Megatron-LM's delayed
    for recipe, nbytes in (("delayed", 3), ("TensorWise", 5), ("mxfp8", 4)):
        opts = step_options_for(H100, flash=True, framework="megatron",
                                overrides={"fp8_recipe": recipe})
        assert (opts.fp8_recipe, opts.fp8_cast_bytes) == (recipe.lower(), nbytes)
        assert replace(opts, fp8_recipe="", fp8_cast_bytes=3) == plain
    # Naming Megatron's default prices the same step.
    assert _priced("delayed")["step_seconds"] == pytest.approx(_priced(None)["step_seconds"],
                                                               rel=1e-12)


def test_casts_without_a_fused_amax_cost_more() -> None:
    # tensorwise (an amax pass before each cast) > MXFP8 (unfused norm, no amax) > delayed;
    # the difference is memory-bound compute only: the communication is the same.
    steps = {r: _priced(r) for r in RECIPE_CAST_BYTES}
    assert (steps["delayed"]["step_seconds"] < steps["mxfp8"]["step_seconds"]
            < steps["tensorwise"]["step_seconds"])
    d, t = steps["delayed"]["breakdown"], steps["tensorwise"]["breakdown"]
    assert {k: v for k, v in d.items() if k != "compute"} == {
        k: v for k, v in t.items() if k != "compute"}


def test_bad_recipes_are_refused_with_the_field() -> None:
    with pytest.raises(SpecError, match=r"fp8_recipe.*delayed, tensorwise, mxfp8"):
        step_options_for(H100, flash=True, overrides={"fp8_recipe": "nvfp4"})
    with pytest.raises(SpecError, match=r"fp8_recipe.*torchao"):
        step_options_for(H100, flash=True, framework="torchtitan",
                         overrides={"fp8_recipe": "tensorwise"})
    with pytest.raises(SpecError, match=r"fp8_recipe.*needs --dtype fp8, not bf16"):
        _priced("tensorwise", dtype="bf16")


@pytest.mark.parametrize(("extra", "said"), [
    ((), "fp8_recipe='tensorwise': is an fp8 setting: needs --dtype fp8, not bf16"),
    (("--dtype", "fp8", "--layout", "fp8_recipe=nvfp4"),
     "fp8_recipe='nvfp4': must be one of delayed, tensorwise, mxfp8"),
    (("--dtype", "fp8", "--framework", "torchtitan"),
     "fp8_recipe='tensorwise': is Transformer Engine's"),
])
def test_the_cli_refuses_a_recipe_on_one_line(capsys: pytest.CaptureFixture[str],
                                              extra: tuple[str, ...], said: str) -> None:
    args = ["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16", "--seq", "8192",
            "--layout", "dp=8 fp8_recipe=tensorwise", *extra]
    rc = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and said in err[0], err


def test_each_transformer_engine_fp8_row_names_the_recipe_its_source_states() -> None:
    rows = [r for r in RUNS if r.dtype == "fp8" and r.framework == "megatron"]
    named = 0
    for r in rows:
        recipe = re.search(r"fp8_recipe=(\w+)", r.options)
        text = f"{r.checked} {' '.join(r.assumed)}"
        if re.search(r"MXFP8 priced|bf16_with_mxfp8_mixed|fp8_mx", text):
            expected = "mxfp8"
        elif re.search(r"current.scaling|FP8-CS|fp8_cs|FP8_CS", text):
            expected = "tensorwise"
        elif "fp8_recipe 'delayed'" in text:
            expected = "delayed"
        else:  # NeMo 24.07's rows name none (Transformer Engine had only delayed scaling)
            assert recipe is None, r.name
            continue
        named += 1
        assert recipe is not None and recipe.group(1) == expected, r.name
    assert named == 37


def test_versus_names_a_recipe_change_and_no_published_record(
        capsys: pytest.CaptureFixture[str]) -> None:
    layout = "dp=8 tp=1 pp=1 zero=1 micro_batch=2 recompute=none"
    args = ["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16", "--seq", "8192",
            "--dtype", "fp8", "--framework", "megatron", "--json"]
    rc = main([*args, "--layout", layout, "--versus", layout + " fp8_recipe=tensorwise"])
    versus = json.loads(capsys.readouterr().out)["versus"]
    assert rc == 0
    assert versus["changes"] == {"fp8_recipe": ["", "tensorwise"]}
    # No published pair changed the recipe alone: the bf16/fp8 pairs' record is not quoted.
    assert versus["kind"] == "other" and versus["chooser"] is None
    assert versus["ratio"] > 1.0
    # Megatron's default is delayed scaling: naming it prices the layout as --layout does.
    rc = main([*args, "--layout", layout, "--versus", layout + " fp8_recipe=delayed"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is priced as --layout's layout is" in err[0]
    # A bad recipe in B is refused under versus.
    rc = main([*args, "--layout", layout, "--versus", layout + " fp8_recipe=nvfp4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("shardlab plan: error: versus=")


def test_an_fp8_attention_kernel_needs_the_fp8_dtype_and_megatron(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16", "--seq", "32768",
            "--layout", "dp=8 micro_batch=1 recompute=full zero=1 flash_kernel=fp8"]
    rc = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["shardlab plan: error: flash_kernel='fp8': is an fp8 setting: "
                               "needs --dtype fp8, not bf16"]
    steps = {}
    for kernel in ("fp8", "fa3"):
        run = [*args[:-1], args[-1].replace("fp8", kernel), "--dtype", "fp8", "--json"]
        assert main(run) == 0
        steps[kernel] = json.loads(capsys.readouterr().out)["best"][0]["step_seconds"]
    assert steps["fp8"] < 0.9 * steps["fa3"]  # the attention core is most of a 32K step
    for framework in ("torchtitan", "fsdp", "deepspeed"):
        with pytest.raises(SpecError, match=r"flash_kernel.*--framework megatron.*fa2, fa3"):
            step_options_for(H100, flash=True, framework=framework,
                             overrides={"flash_kernel": "fp8"})


def test_versus_an_fp8_kernel_quotes_no_published_record(
        capsys: pytest.CaptureFixture[str]) -> None:
    layout = "dp=8 tp=1 pp=1 zero=1 micro_batch=2 recompute=none flash_kernel=fa3"
    rc = main(["plan", "llama-3-8b", "--gpus", "8", "--global-batch", "16", "--seq", "8192",
               "--dtype", "fp8", "--framework", "megatron", "--json", "--layout", layout,
               "--versus", layout.replace("fa3", "fp8")])
    versus = json.loads(capsys.readouterr().out)["versus"]
    assert rc == 0 and versus["changes"] == {"flash_kernel": ["fa3", "fp8"]}
    assert versus["kind"] == "other" and versus["chooser"] is None
