"""Layout's context-parallel, uneven-stage and HSDP fields: defaults, describe() and the
one-line refusals."""

from __future__ import annotations

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.layout import make_layout
from shardlab.errors import SpecError

LLAMA = get_model("llama-3-8b")


def test_cp_is_its_own_mesh_dim() -> None:
    lay = make_layout(LLAMA, gpus=64, tp=2, cp=8, seq=131_072, zero=3, dp_replicate=2)
    assert (lay.dp, lay.cp, lay.gpus, lay.dp_shard) == (4, 8, 64, 2)
    assert lay.microbatches == lay.global_batch // lay.dp  # cp ranks share sequences
    assert lay.describe().endswith("schedule=1f1b cp=8 dp_replicate=2")
    dense = make_layout(LLAMA, gpus=8)
    assert (dense.cp, dense.stage_layers, dense.dp_replicate, dense.dp_shard) == (1, (), 1, 8)
    assert "cp=" not in dense.describe() and "stage_layers" not in dense.describe()


def test_uneven_stages() -> None:
    lay = make_layout(LLAMA, gpus=16, pp=2, stage_layers=[15, 17])
    assert lay.stage_layers == (15, 17) and lay.describe().endswith("stage_layers=15+17")
    v = make_layout(LLAMA, gpus=16, pp=2, virtual_stages=2, stage_layers=(7, 8, 8, 9),
                    global_batch=16)
    assert v.stage_layers == (7, 8, 8, 9)


@pytest.mark.parametrize(("kw", "message"), [
    ({"cp": 4, "seq": 1004}, r"cp=4: must split seq \(1004\) into 2\*cp=8 equal chunks"),
    ({"cp": 0}, "cp=0: must be a positive integer"),
    ({"gpus": 12, "cp": 8}, r"gpus=12: must be a multiple of cp\*tp\*pp \(8\*1\*1=8\)"),
    ({"gpus": 16, "dp": 4, "cp": 2}, r"must equal dp\*cp\*tp\*pp \(4\*2\*1\*1=8\)"),
    ({"pp": 2, "stage_layers": [30, 1]}, "must sum to the model's 32 layers, not 31"),
    ({"pp": 2, "stage_layers": [32, 0]}, "must give every stage at least one layer"),
    ({"pp": 2, "stage_layers": [32]}, r"must give 2 counts \(pp x virtual_stages"),
    ({"dp_replicate": 3}, r"dp_replicate=3: must divide dp \(16\)"),
    ({"dp_replicate": 2}, "needs zero >= 1"),
])
def test_bad_values_name_the_field(kw: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        make_layout(LLAMA, **{"gpus": 16, **kw})
