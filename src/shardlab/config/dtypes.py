"""Dtype policies: how many bytes each weight, gradient, optimizer and activation element takes.

The bytes follow the ZeRO paper's accounting (Rajbhandari et al. 2020, Sec. 3.1)
for Adam; the names match what shardlab's simulator and real runs use, so one
formula serves all three views.

=============  ======  =====  =========  ===========  ======================================
policy         weight  grad   optimizer  activation   what it is
=============  ======  =====  =========  ===========  ======================================
bf16           2       2      12         2            Megatron/DeepSpeed mixed precision:
                                                      fp32 master + Adam m, v
fp16           2       2      12         2            the same with fp16 (loss scaling)
amp-bf16       4       4      8          2            torch autocast / FSDP2 MixedPrecision:
                                                      fp32 params and grads, bf16 compute
bf16-pure      2       2      4          2            everything bf16, Adam m, v in bf16
fp32           4       4      8          4            plain fp32 Adam
fp64           8       8      16         8            float64 Adam (the simulator's exact mode)
=============  ======  =====  =========  ===========  ======================================
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import SpecError


@dataclass(frozen=True)
class DtypePolicy:
    """Bytes per element of each kind of training state, and the matmul dtype."""

    name: str
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    compute: str
    description: str

    @property
    def state_bytes(self) -> int:
        """Bytes per parameter of weights + gradients + optimizer state (16 for bf16 + Adam)."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes


POLICIES: dict[str, DtypePolicy] = {p.name: p for p in (
    DtypePolicy("bf16", 2, 2, 12, 2, "bf16", "bf16 weights/grads, fp32 master + Adam m, v"),
    DtypePolicy("fp16", 2, 2, 12, 2, "fp16", "fp16 weights/grads, fp32 master + Adam m, v"),
    DtypePolicy("amp-bf16", 4, 4, 8, 2, "bf16", "fp32 params/grads/Adam, bf16 autocast compute"),
    DtypePolicy("bf16-pure", 2, 2, 4, 2, "bf16", "bf16 everywhere, Adam m, v in bf16"),
    DtypePolicy("fp32", 4, 4, 8, 4, "fp32", "fp32 everywhere, Adam m, v in fp32"),
    DtypePolicy("fp64", 8, 8, 16, 8, "fp64", "float64 everywhere (exact checks)"),
)}


def get_policy(name: str) -> DtypePolicy:
    """The policy called ``name`` (exact, case-insensitive)."""
    p = POLICIES.get(name.lower())
    if p is None:
        raise SpecError("dtype", name, f"must be one of {', '.join(POLICIES)}")
    return p
