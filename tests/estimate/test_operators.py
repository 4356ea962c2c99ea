"""The per-operator table of one layer agrees with the FLOP model and the roofline."""

import pytest

from shardlab.config.catalog import get_model
from shardlab.config.hardware import ACCELERATORS
from shardlab.estimate.flops import layer_matmul_weights
from shardlab.estimate.operators import layer_operators

H100 = ACCELERATORS["H100 SXM"]


@pytest.mark.parametrize("name", ["gpt2", "llama-3-8b", "hypo-100b"])
def test_matmul_flops_equal_the_layer_forward(name: str) -> None:
    m = get_model(name)
    b, s = 2, 512
    ops = layer_operators(m, H100, b, s, s)
    matmul = sum(o.roofline.flops for o in ops if o.kind == "matmul")
    want = b * s * (2 * layer_matmul_weights(m, False) + 4 * s * m.q_dim)
    assert matmul == want


def test_decode_matmuls_are_memory_bound_training_ones_compute_bound() -> None:
    m = get_model("llama-3-8b")
    decode = {o.name: o.roofline for o in layer_operators(m, H100, 1, 1, 4096)}
    train = {o.name: o.roofline for o in layer_operators(m, H100, 4, 4096, 4096)}
    assert decode["QKV projection"].bound == "memory"
    assert train["QKV projection"].bound == "compute"
    assert all(o.roofline.seconds == max(o.roofline.t_compute, o.roofline.t_memory)
               for o in layer_operators(m, H100, 1, 1, 4096))


def test_gpt_operator_names() -> None:
    names = [o.name for o in layer_operators(get_model("gpt2"), H100, 1, 16, 16)]
    assert names[0] == "LayerNorm 1" and "GELU" in names and "rotary embedding" not in names
