"""The dense MLP of a block, and of a mixture-of-experts layer's shared experts.

``gpt`` style: up, GELU (tanh approximation, as GPT-2), down, with biases (Radford et al.
2019). ``llama`` style: SwiGLU, ``down(silu(gate x) * up x)`` without biases (Shazeer
2020, "GLU Variants Improve Transformer"). Parameters: gpt 2*d*f + f + d, llama 3*d*f
(:func:`shardlab.estimate.params.mlp_params`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardlab.config.model import ModelShape


class MLP(nn.Module):
    """GELU MLP (up, down) for gpt style; SwiGLU (gate, up, down) for llama style.

    ``d_ff`` is the hidden width (0: the shape's ``d_ff``); a MoE layer's shared experts
    are one MLP of width ``shared_experts * shared_d_ff``.
    """

    def __init__(self, shape: ModelShape, dtype: torch.dtype, d_ff: int = 0) -> None:
        super().__init__()
        d, f = shape.d_model, d_ff or shape.d_ff
        self.swiglu = shape.style == "llama"
        if self.swiglu:
            self.gate_proj = nn.Linear(d, f, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(d, f, bias=shape.biases, dtype=dtype)
        self.down_proj = nn.Linear(f, d, bias=shape.biases, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d] -> [..., d]."""
        if self.swiglu:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))
