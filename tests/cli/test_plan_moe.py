"""``shardlab plan`` of a mixture-of-experts model: ep and etp searched, all-to-all priced."""

import json

import numpy as np
import pytest

from shardlab.cli import main
from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.plan.memory import MemoryOptions, memory_arrays
from shardlab.plan.search import device_of, layout_candidates, parse_layout, train_command
from shardlab.plan.space import Space
from shardlab.plan.step_time import step_seconds

MIXTRAL = ["mixtral-8x7b", "--gpu", "H100", "--gpus", "64", "--global-batch", "512", "--seq",
           "4096"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_mixtral_search_covers_ep_and_shows_the_alltoall(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *MIXTRAL, "--top", "3", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["moe"] and doc["feasible"] > 0
    for b in doc["best"]:
        assert {"ep", "etp", "capacity_factor"} <= set(b) and "ep_comm" in b["breakdown"]
        assert sum(b["breakdown"].values()) == pytest.approx(b["step_seconds"])
        assert (b["breakdown"]["ep_comm"] > 0) == (b["ep"] > 1)
    assert doc["best"][0]["ep"] > 1  # experts spread over a node's NVLink win at this scale
    code, out, _ = run(capsys, *MIXTRAL, "--top", "2")
    assert code == 0 and "ep·etp" in out and "│ ep " not in out.split("Where")[0]


def test_the_alltoall_is_priced_on_the_link_the_ep_group_spans() -> None:
    m = get_model("mixtral-8x7b")
    acc = get_accelerator("H100")
    space = Space(gpus=64, global_batch=512, seq=4096)
    policy = get_policy("bf16")
    inside = layout_candidates(m, space, "tp=1 ep=8 zero=1")  # 8 ranks: one node
    across = layout_candidates(m, space, "tp=2 ep=8 zero=1")  # 16 ranks: two nodes
    dev, _ = device_of(acc, policy, 64)
    secs = []
    for c in (inside, across):
        mem = memory_arrays(m, c, 4096, policy, MemoryOptions(False, True))
        per_step = step_seconds(m, c, mem, 4096, 512, policy, dev)["ep_comm"][0]
        secs.append(per_step / c.microbatches[0])
    # Same bytes per rank and micro-batch (each tp rank sends its own copy): 32 layers x 4
    # all-to-alls of T·k rows of d bf16 values, 1/8 of them to each member of the group.
    # In one node each is 7·α + 7/8 of the rows over NVLink; across two nodes (4 members in
    # each, strided by etp = 2) 3/8 cross NVLink and 4/8 the network at once.
    rows = 4096 * 2 * 4096 * 2
    intra, inter = acc.intra_link, acc.inter_link
    frac = dev.eff.link_fraction
    assert secs[0] == pytest.approx(
        32 * 4 * (7 * intra.latency + 7 / 8 * rows / (intra.bandwidth * frac)), rel=1e-12)
    assert secs[1] == pytest.approx(32 * 4 * (
        3 * intra.latency + 4 * inter.latency
        + max(3 / 8 * rows / (intra.bandwidth * frac), 4 / 8 * rows / (inter.bandwidth * frac))
    ), rel=1e-12)


def test_layout_takes_ep_etp_and_capacity_and_budget_agrees(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_layout("ep=8 etp=1 capacity_factor=1.25") == {
        "ep": "8", "etp": "1", "capacity_factor": "1.25"}
    code, out, err = run(capsys, *MIXTRAL[:5], "--global-batch", "64", "--seq", "4096",
                         "--layout", "tp=2 ep=4 etp=1 zero=3 capacity_factor=1.25", "--json")
    assert code == 0, err
    b = json.loads(out)["best"][0]
    assert (b["dp"], b["tp"], b["ep"], b["etp"], b["capacity_factor"]) == (32, 2, 4, 1, 1.25)
    assert main(["budget", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--ep", "4", "--etp",
                 "1", "--zero", "3", "--capacity-factor", "1.25", "--global-batch", "64",
                 "--seq", "4096", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert b["memory_per_device"] == pytest.approx(doc["memory"]["per_device"]["total"],
                                                   rel=1e-12)
    # Pairs split on spaces or commas; a comma inside stage_layers continues its value.
    assert parse_layout("tp=2,pp=2 stage_layers=15,17,zero=1") == {
        "tp": "2", "pp": "2", "stage_layers": "15,17", "zero": "1"}


def test_dense_models_get_no_ep_and_train_commands_name_it() -> None:
    c = layout_candidates(get_model("llama-3-8b"), Space(gpus=8, global_batch=8, seq=1024),
                          "tp=2")
    assert (c.ep.tolist(), c.etp.tolist()) == ([1], [2])
    lay = {"dp": 4, "tp": 1, "pp": 1, "virtual_stages": 1, "zero": 3, "sp": False,
           "recompute": "none", "schedule": "1f1b", "micro_batch": 1, "ep": 2, "etp": 1,
           "capacity_factor": 0.0}
    assert train_command("shardlab train", lay, 8, 32, "fp32").endswith("--ep 2")
    assert np.isfinite(c.capacity_factor).all()


@pytest.mark.parametrize(("argv", "field"), [
    ([*MIXTRAL, "--layout", "ep=3"], "ep=3: must divide moe.experts"),
    ([*MIXTRAL, "--layout", "tp=2 etp=4"], "etp=4"),
    ([*MIXTRAL, "--layout", "capacity_factor=x"], "capacity_factor='x'"),
    ([*MIXTRAL, "--ep", "16"], "ep=16"),
    (["llama-3-8b", "--gpus", "8", "--global-batch", "8", "--ep", "2"], "dense"),
    (["llama-3-8b", "--gpus", "8", "--global-batch", "8", "--capacity-factor", "1"], "dense"),
])
def test_bad_expert_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str],
                                             argv: list[str], field: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and field in err, err
