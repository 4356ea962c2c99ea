"""The plain tensors that hold a tensor's data (``shardlab.distributed.inner``), and the
saved-tensor meter counting a float8 tensor by them."""

from __future__ import annotations

from typing import Any

import torch
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
from torchao.float8.float8_training_tensor import LinearMMConfig

from shardlab.distributed.inner import data_tensors
from shardlab.distributed.saved import saved_activation_bytes, weight_local


def float8(rows: int, cols: int) -> Any:
    """A torchao float8 tensor (tensorwise scale) of a bf16 [rows, cols]."""
    hp = torch.randn(rows, cols, dtype=torch.bfloat16)
    return hp_tensor_to_float8_dynamic(hp, torch.float8_e4m3fn, LinearMMConfig())


def test_a_plain_tensor_is_itself() -> None:
    t = torch.zeros(3, 4)
    assert data_tensors(t) == [t]


def test_a_float8_tensor_is_its_one_byte_data_and_its_scale() -> None:
    x = float8(8, 16)
    data, scale = data_tensors(x)
    assert (data.dtype, data.numel() * data.element_size()) == (torch.float8_e4m3fn, 128)
    assert scale.dtype == torch.float32 and scale.numel() == 1
    # The wrapper's own storage is sized by its outer dtype: what counting it read.
    assert x.dtype == torch.bfloat16 and x.untyped_storage().nbytes() == 256


class _Keep(torch.autograd.Function):
    """Multiplies by 2 and saves a tensor handed to it, as a linear saves its input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(kept)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * 2, None


def test_the_saved_meter_counts_a_float8_tensor_at_one_byte_and_its_scale() -> None:
    x = torch.ones(4, requires_grad=True)
    kept = float8(8, 16)
    _, saved = saved_activation_bytes(lambda: _Keep.apply(x, kept))
    assert saved == 8 * 16 * 1 + 4  # not 8 x 16 x 2, the bf16 outer dtype's


def test_the_saved_meter_leaves_out_a_dtensor_weights_local_tensor() -> None:
    """A matmul by a view of a DTensor weight's local tensor (the expert-parallel experts'
    ``w_up[e]``) saves a plain tensor that is neither a Parameter nor a view of one; taken
    through ``weight_local`` the meter knows it for a weight (49 KB a MoE layer of issue
    16's tiny MoE at ep 2 were counted as activations before)."""
    x = torch.randn(2, 4, requires_grad=True)
    plain, local = torch.randn(3, 4, 4), torch.randn(3, 4, 4)  # [experts, d, f]
    _, counted = saved_activation_bytes(lambda: x @ plain[1])
    _, left_out = saved_activation_bytes(lambda: x @ weight_local(local)[1])
    assert (counted, left_out) == (3 * 4 * 4 * 4, 0)  # the whole storage; nothing
