"""ModelShape: derived fields and validation that names the field."""

import pytest

from shardlab.config.model import ModelShape, MoE
from shardlab.errors import SpecError


def test_defaults_are_derived() -> None:
    m = ModelShape("t", layers=2, d_model=64, heads=4, vocab=100, context=32)
    assert (m.kv_heads, m.head_dim, m.d_ff) == (4, 16, 256)
    assert (m.q_dim, m.kv_dim) == (64, 64)


def test_explicit_head_dim_is_not_d_over_heads() -> None:
    m = ModelShape("t", 2, 5120, 32, 1000, 64, kv_heads=8, head_dim=128, style="llama")
    assert (m.q_dim, m.kv_dim) == (4096, 1024)


@pytest.mark.parametrize(("kw", "field"), [
    ({"layers": 0}, "layers"), ({"d_model": -1}, "d_model"), ({"heads": 0}, "heads"),
    ({"vocab": 0}, "vocab"), ({"context": -5}, "context"), ({"kv_heads": 3}, "kv_heads"),
    ({"style": "bert"}, "style"), ({"heads": 5}, "heads"), ({"d_ff": -1}, "d_ff"),
    ({"layers": True}, "layers"), ({"layers": 2.0}, "layers"),
])
def test_bad_shape_names_the_field(kw: dict, field: str) -> None:
    base = {"name": "t", "layers": 2, "d_model": 64, "heads": 4, "vocab": 100, "context": 32}
    with pytest.raises(SpecError) as e:
        ModelShape(**{**base, **kw})
    assert e.value.field == field


def test_moe_validation() -> None:
    with pytest.raises(SpecError, match="experts_per_token"):
        MoE(experts=4, experts_per_token=5, expert_d_ff=8)
    assert MoE(experts=4, experts_per_token=2, expert_d_ff=8).shared_d_ff == 8
    with pytest.raises(SpecError, match="dense_layers"):
        ModelShape("t", 2, 64, 4, 100, 32, moe=MoE(4, 2, 8, dense_layers=3))


def test_group_limited_routing_validation() -> None:
    # DeepSeek-V3: 256 experts in 8 groups, each token's 8 from its best 4 groups.
    assert MoE(256, 8, 2048, groups=8, group_topk=4).groups == 8
    for kw, field in (({"groups": 3}, "moe.groups"), ({"groups": 8, "group_topk": 9},
                                                      "moe.group_topk"),
                      ({"groups": 8, "group_topk": 3}, "moe.group_topk")):
        with pytest.raises(SpecError) as e:
            MoE(256, 8, 2048, **kw)
        assert e.value.field == field
