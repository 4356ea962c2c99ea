"""Layout validation: every constraint says which number is wrong and why."""

import re

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.layout import make_layout
from shardlab.errors import SpecError

LLAMA = get_model("llama-3-8b")  # 32 heads, 8 kv heads, d_ff 14336, 32 layers


def test_defaults() -> None:
    lay = make_layout(LLAMA, gpus=64, tp=8, pp=2)
    assert (lay.dp, lay.gpus, lay.seq, lay.schedule) == (4, 64, 8192, "1f1b")
    assert lay.global_batch == 4 * 1 * 2 and lay.microbatches == 2
    assert make_layout(LLAMA, pp=4, virtual_stages=2).schedule == "interleaved-1f1b"


@pytest.mark.parametrize(("kw", "field", "words"), [
    ({"tp": 16}, "tp", "kv_heads"),          # 8 kv heads
    ({"tp": 3}, "tp", "heads"),
    ({"gpus": 10, "tp": 4}, "gpus", "multiple of tp*pp"),
    ({"gpus": 8, "dp": 4, "tp": 4}, "gpus", "dp*tp*pp"),
    ({"zero": 4}, "zero", "0, 1, 2 or 3"),
    ({"recompute": "some"}, "recompute", "selective"),
    ({"dtype": "int4"}, "dtype", "bf16"),
    ({"sp": True}, "sp", "tp > 1"),
    ({"pp": 33}, "pp", "layers"),
    ({"pp": 16, "virtual_stages": 4}, "pp", "layers"),
    ({"dp": 4, "global_batch": 6}, "global_batch", "multiple of dp*micro_batch"),
    ({"pp": 4, "virtual_stages": 2, "global_batch": 6}, "global_batch", "multiple of pp"),
    ({"virtual_stages": 2, "schedule": "1f1b"}, "virtual_stages", "must be 1"),
    ({"pp": 4, "schedule": "zb-v"}, "virtual_stages", "must be 2"),
    ({"schedule": "interleaved-1f1b"}, "pp", "must be >= 2 for interleaved-1f1b"),
    ({"pp": 2, "schedule": "interleaved-1f1b"}, "virtual_stages", ">= 2 for interleaved"),
    ({"pp": 4, "virtual_stages": 2, "schedule": "dualpipev", "global_batch": 4},
     "global_batch", "dualpipev needs at least 2*pp (8)"),
    ({"schedule": "wavy"}, "schedule", "gpipe"),
    ({"tp": 0}, "tp", "positive"),
    ({"micro_batch": -1}, "micro_batch", "positive"),
    ({"seq": 0}, "seq", "positive"),
])
def test_bad_layout_names_the_field(kw: dict, field: str, words: str) -> None:
    with pytest.raises(SpecError, match=re.escape(words)) as e:
        make_layout(LLAMA, **kw)
    assert e.value.field == field


def test_gpt_seq_limited_by_position_table() -> None:
    with pytest.raises(SpecError, match="position table"):
        make_layout(get_model("gpt2"), seq=2048)
    assert make_layout(LLAMA, seq=16384).seq == 16384  # rotary: no table to outgrow


def test_describe_round_trips_the_numbers() -> None:
    lay = make_layout(LLAMA, gpus=128, tp=8, pp=4, virtual_stages=2, zero=1, sp=True,
                      global_batch=64, recompute="selective")
    text = lay.describe()
    for part in ("dp=4", "tp=8", "pp=4", "virtual=2", "zero=1", "sp=1", "global_batch=64",
                 "recompute=selective", "schedule=interleaved-1f1b"):
        assert part in text
