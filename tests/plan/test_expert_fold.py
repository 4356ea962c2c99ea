"""The expert mesh folded over each stage's tp x cp x dp ranks (Megatron-Core's parallel
folding, torchtitan's sparse mesh): what ``--framework megatron|torchtitan`` lets the
planner express and how it prices it (plan/overlap.Framework.expert_fold)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardlab.cli import main
from shardlab.config.layout import make_layout
from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError
from shardlab.estimate.states import zero_groups
from shardlab.plan.choices import expert_choices
from shardlab.plan.expert_time import ep_members_per_node
from shardlab.plan.memory import zero_group_arrays
from shardlab.plan.overlap import FRAMEWORKS
from shardlab.plan.search import layout_candidates
from shardlab.plan.space import Space

MOE = ModelShape("moe-128x8", 8, 1024, 16, vocab=32000, context=4096, kv_heads=4,
                 d_ff=4096, style="llama", tied=False,
                 moe=MoE(experts=128, experts_per_token=8, expert_d_ff=512))
FLAGS = ("--style", "llama", "--layers", "8", "--d-model", "1024", "--heads", "16",
         "--kv-heads", "4", "--vocab", "32000", "--experts", "128", "--top-k", "8",
         "--expert-d-ff", "512", "--seq", "4096", "--gpu", "h100")


def test_megatron_and_torchtitan_fold_others_do_not() -> None:
    assert FRAMEWORKS["megatron"].expert_fold and FRAMEWORKS["torchtitan"].expert_fold
    assert not FRAMEWORKS["deepspeed"].expert_fold and not FRAMEWORKS["fsdp"].expert_fold


def test_folded_choices_divide_the_stage_ranks() -> None:
    """dp 4 x tp 2: unfolded ep divides dp (1, 2, 4, each with etp 2 and 1); folded, etp = tp
    takes ep | dp·cp and etp = 1 takes ep | dp·cp·tp (8 with cp 1, 16 with cp 2)."""
    assert expert_choices(MOE, 4, 2) == [(1, 2), (2, 2), (4, 2), (1, 1), (2, 1), (4, 1)]
    folded = expert_choices(MOE, 4, 2, fold=True)
    assert (8, 1) in folded and (8, 2) not in folded
    assert (16, 1) in expert_choices(MOE, 4, 2, cp=2, fold=True)


def test_layout_check_names_the_folded_ranks() -> None:
    kw = {"gpus": 64, "tp": 2, "pp": 8, "ep": 8, "etp": 1, "zero": 1, "global_batch": 64}
    with pytest.raises(SpecError, match=r"ep=8: must divide dp \(4\)"):
        make_layout(MOE, **kw)  # type: ignore[arg-type]
    lay = make_layout(MOE, expert_fold=True, **kw)  # type: ignore[arg-type]
    assert lay.expert_replicas == 1  # tp 2 x dp 4 / ep 8
    with pytest.raises(SpecError, match=r"must divide tp\*cp\*dp/etp \(8\)"):
        make_layout(MOE, expert_fold=True, **{**kw, "ep": 16})  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "gpus", "expect"), [
    # tp 4, dp 8, ep 8, etp 1: Megatron's expert data parallel is 32 / 8 = 4 (unfolded: 1).
    ("dp=8 tp=4 pp=1 ep=8 etp=1 zero=1 sp=1", 32, 4),
    # etp = tp: the expert mesh is tp x (cp·dp), ep over cp·dp = 8: replicas 2 x ... = 1.
    ("dp=4 tp=2 cp=2 ep=8 etp=2 zero=1", 16, 1),
    ("dp=4 tp=2 cp=2 ep=4 etp=1 zero=1", 16, 4),
])
def test_expert_replicas_agree_between_plan_and_estimate(text: str, gpus: int,
                                                         expect: int) -> None:
    sp = Space(gpus=gpus, global_batch=gpus, seq=4096, expert_fold=True)
    c = layout_candidates(MOE, sp, text)
    _, egroup, _, _ = zero_group_arrays(c)
    raw = dict(kv.split("=") for kv in text.split())
    lay = make_layout(MOE, gpus=gpus, global_batch=gpus, seq=4096, expert_fold=True,
                      **{k: (bool(int(v)) if k == "sp" else int(v)) for k, v in raw.items()})
    assert int(egroup[0]) == lay.expert_replicas == zero_groups(lay).experts == expect


def test_unfolded_replicas_are_unchanged() -> None:
    sp = Space(gpus=32, global_batch=32, seq=4096)
    c = layout_candidates(MOE, sp, "dp=8 tp=4 ep=8 etp=1 zero=1 sp=1")
    assert int(zero_group_arrays(c)[1][0]) == 1


def test_folded_ep_group_has_no_cp_rank_inside() -> None:
    """Unfolded, an ep group of 4 with cp 2 spans 4·etp·cp ranks; folded, 4·etp: with etp 2
    that is 16 against 8 ranks, so in 8-GPU nodes 2 members against all 4 share a node."""
    text = "dp=4 tp=2 cp=2 ep=4 etp=2 zero=1"
    for fold, members in ((False, 2), (True, 4)):
        c = layout_candidates(MOE, Space(gpus=16, global_batch=16, seq=4096,
                                         expert_fold=fold), text)
        assert int(ep_members_per_node(c, c.cp, 8)[0]) == members


def test_plan_megatron_prices_ep_beyond_dp_and_shards_expert_states(
        capsys: pytest.CaptureFixture[str]) -> None:
    layout = "dp=4 tp=2 pp=8 ep=8 etp=1 zero=1 sp=1 micro_batch=1"
    code = main(["plan", *FLAGS, "--gpus", "64", "--global-batch", "64", "--layout", layout,
                 "--framework", "megatron", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    best = doc["best"][0]
    assert best["ep"] == 8 and best["dp"] == 4 and doc["expert_fold"] is True
    # Without a folding framework the same layout is refused on one line, exit 2.
    code = main(["plan", *FLAGS, "--gpus", "64", "--global-batch", "64", "--layout", layout])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "ep=8: must divide dp (4)" in err[0]


def test_folding_shards_expert_optimizer_state_over_the_tensor_ranks(
        capsys: pytest.CaptureFixture[str]) -> None:
    """tp 4, dp 8, ep 8, etp 1, ZeRO-1: folded, each expert's AdamW state shards over 4
    ranks; unfolded over 1, so the folded optimizer bytes are smaller by the experts' 3/4."""
    layout = "dp=8 tp=4 pp=2 ep=8 etp=1 zero=1 sp=1 micro_batch=1"
    opt = {}
    for fw in ("megatron", "deepspeed"):
        assert main(["plan", *FLAGS, "--gpus", "64", "--global-batch", "64", "--layout",
                     layout, "--framework", fw, "--json"]) == 0
        best = json.loads(capsys.readouterr().out)["best"][0]
        opt[fw] = best["memory_breakdown"]["optimizer"]
    # Stage 0's 4 MoE layers: 128/8 experts each of 3 matrices 1024 x 512, fp32 master
    # weights and two AdamW moments (12 B per parameter).
    experts = 4 * 16 * 3 * 1024 * 512
    assert np.isclose(opt["deepspeed"] - opt["megatron"], experts * 12 * 3 / 4, rtol=1e-9)
    assert opt["megatron"] > experts * 12 / 4
