"""``shardlab train``'s bad input, dense and mixture-of-experts layouts alike: exit code 2
and one line on stderr naming the field, refused before any rank is started (within 3 s);
``shardlab dryrun`` refuses a mixture of experts' learned routing the same way. (The parity runs:
``test_train_cli.py``.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tests.cli.train_cli_support import MOE

from shardlab.cli import main


@pytest.mark.parametrize(("argv", "words"), [
    (["--dp", "2", "--nproc", "3"], "nproc=3"),
    (["--tp", "3"], "tp=3"),
    (["--pp", "5"], "pp=5"),
    (["--dp", "2", "--micro-batch", "3"], "micro_batch=3"),
    (["--global-batch", "7", "--dp", "2"], "global_batch=7"),
    (["--data", "/nonexistent/corpus.txt"], "data="),
    (["--dp", "2", "--tp", "2", "--dp-mode", "ddp"], "dp_mode='ddp'"),
    (["--dp", "2", "--pp", "2", "--micro-batch", "1", "--dp-mode", "ddp"], "dp_mode='ddp'"),
    (["--pp", "2", "--micro-batch", "8"], "1f1b needs at least pp=2"),
    (["--loss-parallel"], "loss_parallel=True: needs tp > 1"),
    (["--pp", "2", "--micro-batch", "2", "--global-batch", "6",
      "--schedule", "interleaved-1f1b", "--virtual-stages", "2"], "multiple of pp=2"),
    (["--pp", "2", "--micro-batch", "2", "--virtual-stages", "2"], "schedule='1f1b'"),
    (["--pp", "2", "--micro-batch", "2", "--schedule", "interleaved-1f1b"], "virtual_stages=1"),
    # Issue 17: cp must cut the sequence into 2cp chunks; the stages' layer counts must sum
    # to the model's and leave none empty; the replicas must divide dp.
    (["--cp", "3"], "cp=3: must split seq (32) into 2*cp=6 equal chunks"),
    (["--pp", "2", "--stage-layers", "3,2"], "stage_layers='3+2': must sum to the model's 4"),
    (["--pp", "2", "--stage-layers", "4,0"], "stage_layers='4+0': must give every stage"),
    (["--pp", "2", "--stage-layers", "3,1,0"], "stage_layers='3+1+0': must give 2 counts"),
    (["--dp", "4", "--dp-replicate", "3"], "dp_replicate=3: must divide dp (4)"),
    (["--dp", "2", "--dp-replicate", "2", "--dp-mode", "ddp"], "dp_replicate=2: needs FSDP"),
    (["--dp", "2", "--cp", "2", "--nproc", "2"], "nproc=2: must equal dp*cp*tp*pp (4)"),
    (["--recompute", "ops"], "--recompute: invalid choice: 'ops'"),
])
def test_bad_input_before_any_rank(capsys: pytest.CaptureFixture[str], argv: list[str],
                                   words: str) -> None:
    start = time.monotonic()
    try:
        code = main(["train", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, err
    assert time.monotonic() - start < 3  # no rank was started


@pytest.mark.parametrize(("argv", "words"), [
    (["--dp", "3", "--ep", "3", "--global-batch", "9"], "ep=3: must divide moe.experts (8)"),
    (["--dp", "2", "--ep", "4"], "ep=4: must divide dp (2)"),
    (["--dp", "2", "--ep", "2", "--dp-mode", "ddp"], "dp_mode='ddp'"),
    (["--tp", "2", "--etp", "3"], "etp=3: must be 1 (whole experts) or tp (2)"),
    (["--tp", "2", "--etp", "2", "--expert-d-ff", "33", "--shared-experts", "0"],
     "tp=2: must divide moe.expert_d_ff (33)"),
    (["--tp", "2", "--sp"], "sp=1"),
    (["--dp", "4", "--ep", "4", "--dp-replicate", "2"],
     "ep=4: must divide dp/dp_replicate (2)"),
    (["--cp", "2", "--capacity-factor", "1", "--check-parity"],
     "capacity_factor=1.0: with --cp drops among"),
    (["--cp", "2", "--routing", "contiguous", "--check-parity"],
     "routing='contiguous': with --cp cycles"),
    (["--aux-loss-coef", "nan"], "--aux-loss-coef"),
    (["--dp", "2", "--ep", "2", "--recompute", "op"],
     "recompute='op': is built for dense models only"),
])
def test_moe_bad_input_before_any_rank(capsys: pytest.CaptureFixture[str], argv: list[str],
                                       words: str) -> None:
    """A bad expert layout: exit 2 with one line naming the field, no rank started."""
    start = time.monotonic()
    try:
        code = main(["train", *MOE, *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and words in err, err
    assert time.monotonic() - start < 3


def test_expert_keys_need_a_moe_and_dryrun_routes_contiguously(
        capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in ((["--dp", "2", "--ep", "2"], "ep=2: needs a mixture-of-experts"),
                        (["--tp", "2", "--etp", "2"], "etp=2: needs a mixture-of-experts"),
                        (["--dp", "2", "--routing", "contiguous"],
                         "routing='contiguous': needs a mixture-of-experts")):
        assert main(["train", *argv]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.splitlines()) == 1, err
    # The dry run's fake tensors have no values for a learned router (or a random draw).
    for routing in ("learned", "random"):
        assert main(["dryrun", *MOE[:-2], "--gpus", "2",
                     "--layout", f"dp=2 ep=2 routing={routing}"]) == 2
        err = capsys.readouterr().err
        assert f"routing='{routing}': must be contiguous in a dry run" in err
        assert len(err.strip().splitlines()) == 1


def test_empty_data_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(["train", "--data", str(empty)]) == 2
    assert "data=" in capsys.readouterr().err
