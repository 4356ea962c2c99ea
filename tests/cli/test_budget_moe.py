"""``shardlab budget`` of a mixture-of-experts model: expert parallelism end to end."""

from __future__ import annotations

import json

import pytest

from shardlab.cli import main
from shardlab.config.catalog import get_model
from shardlab.config.hardware import get_accelerator
from shardlab.config.layout import make_layout
from shardlab.estimate.expert import expert_alltoall_bytes, rank_state_bytes

MIXTRAL_PARAMS = 46_702_792_704  # sum of numel over mistralai/Mixtral-8x7B-v0.1's tensors


def budget(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["budget", "mixtral-8x7b", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_mixtral_with_ep_answers_params_states_alltoall_and_time(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = budget(capsys, "--gpus", "64", "--ep", "8", "--tp", "2", "--zero", "3")
    m = get_model("mixtral-8x7b")
    lay = make_layout(m, gpus=64, tp=2, ep=8, zero=3)
    assert doc["params"]["total"] == MIXTRAL_PARAMS
    assert doc["params"]["active_per_token"] == 12_879_925_248
    assert doc["layout"]["ep"] == 8 and doc["layout"]["etp"] == 2
    assert doc["moe"]["experts_per_rank"] == 1 and doc["moe"]["expert_dp"] == 4
    states = rank_state_bytes(m, lay)[0]
    per = doc["memory"]["per_device"]
    assert per["weights"] + per["gradients"] + per["optimizer"] == pytest.approx(states.total)
    assert doc["comm"]["ep_bytes_per_step"] == expert_alltoall_bytes(m, lay) > 0
    assert doc["moe"]["alltoall_bytes_per_step"] == doc["comm"]["ep_bytes_per_step"]
    # 32 layers x 1 micro-batch x 4 all-to-alls of 7/8 of 32,768 x 2 rows of 4,096 bf16.
    assert doc["comm"]["ep_bytes_per_step"] == 32 * 4 * 7 / 8 * 65_536 * 4096 * 2
    assert doc["time"]["train_days"] > 0
    # ep 8 x etp 2 spans 16 ranks, two nodes of 4 members each: 3/7 of the bytes go to
    # peers in the node over NVLink, 4/7 over the network at the same time.
    h100 = get_accelerator("H100")
    nvl, net = h100.intra_link, h100.inter_link
    assert doc["comm"]["ep_link"] == f"{nvl.name} and {net.name}"
    sent, calls = doc["comm"]["ep_bytes_per_step"], 32 * 4
    assert doc["comm"]["ep_alltoall_seconds"] == pytest.approx(
        calls * (3 * nvl.latency + 4 * net.latency)
        + max(sent * 3 / 7 / nvl.bandwidth, sent * 4 / 7 / net.bandwidth), rel=1e-12)
    assert doc["flops"]["moe_forward_per_token"]["routed"] > 0


def test_ep_shrinks_expert_states_and_imbalance_grows_activations(
        capsys: pytest.CaptureFixture[str]) -> None:
    one = budget(capsys, "--gpus", "64", "--zero", "1")
    eight = budget(capsys, "--gpus", "64", "--zero", "1", "--ep", "8")
    # ZeRO-1: each rank keeps the weights of 1/8 of the experts; the optimizer's shard of
    # them is the same (1/8 of the experts over 8 expert-dp ranks = all over 64).
    assert eight["memory"]["per_device"]["weights"] < one["memory"]["per_device"]["weights"] / 6
    assert eight["memory"]["per_device"]["optimizer"] == pytest.approx(
        one["memory"]["per_device"]["optimizer"], rel=1e-12)
    assert eight["params"]["per_device_experts"] * 8 == one["params"]["per_device_experts"]
    assert eight["comm"]["dp_bytes_per_step"] < one["comm"]["dp_bytes_per_step"]
    hot = budget(capsys, "--gpus", "64", "--zero", "1", "--ep", "8", "--routing-imbalance", "2")
    capped = budget(capsys, "--gpus", "64", "--zero", "1", "--ep", "8", "--routing-imbalance",
                    "2", "--capacity-factor", "1.25")
    act = [d["memory"]["per_device"]["activations"] for d in (eight, capped, hot)]
    assert act[0] < act[1] < act[2]
    assert hot["moe"]["routed_rows_per_microbatch"] == 2 * eight["moe"][
        "routed_rows_per_microbatch"]


def test_human_view_has_the_moe_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "mixtral-8x7b", "--gpus", "64", "--ep", "8", "--zero", "3",
                 "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "Mixture of experts" in out and "all-to-all" in out and "ep per step" in out


@pytest.mark.parametrize(("argv", "needles"), [
    (["mixtral-8x7b", "--gpus", "48", "--ep", "3"], ["ep=3", "moe.experts (8)"]),
    (["mixtral-8x7b", "--gpus", "4", "--ep", "8"], ["ep=8", "dp (4)"]),
    (["mixtral-8x7b", "--gpus", "8", "--tp", "2", "--etp", "4"], ["etp=4", "tp (2)"]),
    (["llama-3-8b", "--gpus", "8", "--ep", "2"], ["ep=2", "dense"]),
    (["llama-3-8b", "--capacity-factor", "1.25"], ["capacity_factor=1.25", "dense"]),
    (["mixtral-8x7b", "--capacity-factor", "-1"], ["--capacity-factor", "-1"]),
    (["mixtral-8x7b", "--routing-imbalance", "0.5"], ["--routing-imbalance", ">= 1"]),
    (["--params", "7B", "--ep", "2"], ["ep=2", "MODEL"]),
], ids=["ep-not-dividing-experts", "ep-not-dividing-dp", "etp-not-1-or-tp", "ep-dense",
        "capacity-dense", "capacity-negative", "imbalance-below-1", "params-ep"])
def test_bad_expert_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                                 argv: list[str], needles: list[str]) -> None:
    try:
        code = main(["budget", *argv, "--json"])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, err
    for n in needles:
        assert n in err
