"""A MoE layer's saved tensors against the count `shardlab train` prints beside them: the
cost model's routed part (eager) plus the router's and permutation's own tensors
(train/report_moe.router_extra_bytes), each storage metered once with saved-tensor hooks."""

from __future__ import annotations

import pytest
import torch

from shardlab.config.model import ModelShape, MoE
from shardlab.estimate.expert import routed_activation_bytes
from shardlab.nn.moe import MoEFeedForward
from shardlab.train.config import TrainConfig
from shardlab.train.report_moe import router_extra_bytes

SHAPE = ModelShape("moe", 2, 32, 4, vocab=64, context=64,
                   moe=MoE(8, 2, 32, dense_layers=0))


def saved_bytes(layer: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of every distinct storage the layer's forward saves for backward, less its
    parameters' and its input's."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    own = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    own.add(x.untyped_storage().data_ptr())
    return sum(n for ptr, n in seen.items() if ptr not in own)


@pytest.mark.parametrize(("dtype", "aux", "z", "capacity"), [
    ("fp32", 0.01, 0.0, 0.0), ("fp32", 0.0, 0.0, 0.0), ("fp32", 0.01, 1e-3, 0.0),
    ("bf16", 0.01, 0.0, 0.0), ("bf16", 0.01, 0.0, 1.0)])
def test_a_moe_layer_keeps_what_the_count_says(dtype: str, aux: float, z: float,
                                               capacity: float) -> None:
    torch.manual_seed(0)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    layer = MoEFeedForward(SHAPE, torch_dtype, aux_coef=aux, z_coef=z,
                           capacity_factor=capacity)
    b, s = 4, 64
    x = torch.randn(b, s, SHAPE.d_model, dtype=torch_dtype, requires_grad=True)
    h = x * 1.0  # the block's normed input: not the layer's to count
    got = saved_bytes(layer, h)
    cfg = TrainConfig(SHAPE, global_batch=b, micro_batch=b, seq=s, dtype=dtype,
                      aux_coef=aux, z_coef=z, capacity_factor=capacity)
    e = 2 if dtype == "bf16" else 4
    tokens = b * s
    # The rows the experts took: every assignment, or each expert's first C = 64
    # (T·k/E x the capacity factor).
    counts = layer.last_counts if capacity == 0 else layer.last_counts.clamp(max=64)
    kept = float(counts.sum())
    count = routed_activation_bytes(SHAPE, tokens, e, eager=True, rows=(kept, tokens * 2))
    count += router_extra_bytes(cfg, "none", e)
    # In one process the experts read a view of the permuted [T·k, d] rows, dropped ones
    # included: the meter counts the whole storage (over ep ranks the all-to-all's
    # output holds the kept rows alone).
    count += (tokens * 2 - kept) * SHAPE.d_model * e
    # The router's input is the block's (counted there); the rest to the byte.
    assert got == count, (got, count)
    # Without the router's own tensors the count is short by 6-12% of the layer.
    assert got - (count - router_extra_bytes(cfg, "none", e)) > 0.05 * got


def test_nothing_extra_where_the_block_is_checkpointed() -> None:
    cfg = TrainConfig(SHAPE, global_batch=4, micro_batch=4, seq=64, recompute="full")
    assert router_extra_bytes(cfg, "full", 4) == 0.0
    dense = TrainConfig(ModelShape("d", 2, 32, 4, vocab=64, context=64), global_batch=4,
                        micro_batch=4, seq=64)
    assert router_extra_bytes(dense, "none", 4) == 0.0
