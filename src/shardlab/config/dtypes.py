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
fp8            2 (+2)  2      12         2            bf16 mixed precision whose linear layers
                                                      multiply in fp8 (below)
=============  ======  =====  =========  ===========  ======================================

**fp8** is the bf16 policy with the linear layers' matmuls in fp8 (E4M3 forward, E5M2
gradients), as Transformer Engine (NVIDIA, ``te.Linear`` under ``fp8_autocast``) and
torchao's float8 training (``convert_to_float8_training``, which swaps ``nn.Linear``)
run it: the attention projections, the MLP and the experts multiply in fp8; the
attention core, the output head (torchtitan's ``filter_fqns = ["output"]``), the MoE
router and the norms stay in bf16 (the DeepSeek-V3 report, arXiv 2412.19437 Sec. 3.3,
lists the same split). ``linear`` names that matmul dtype. Weights, gradients and Adam
state keep their bf16 policy bytes; on top, a rank that holds its weights whole (ZeRO
0-2) keeps an fp8 copy of each linear weight and its transpose for the step
(Transformer Engine casts once per step, ``is_first_microbatch``, and Hopper's fp8 GEMM
wants the transposed copy for backward): ``fp8_copy_bytes`` = 2 per linear weight
element, plus the fp32 scaling factors (:mod:`shardlab.estimate.fp8`). Under ZeRO-3 the
weights are all-gathered in fp8 (torchao ``enable_fsdp_float8_all_gather``; Megatron's
``--fp8-param-gather``): ``gather_bytes`` = 1, half the bf16 gather, and the gathered
copy is transient like FSDP's bf16 one. Real fp8 training needs an fp8 tensor core
(H100, H200, B200, GB200, MI300X): it runs on CUDA only, never on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    linear: str = ""
    """Matmul dtype of the linear layers (attention projections, MLP, experts); "" = compute."""
    fp8_copy_bytes: int = 0
    """Extra bytes per linear weight element a rank holding whole weights keeps (module
    docstring: fp8 copy + transpose)."""
    gather_bytes: int = 0
    """Bytes per linear weight element a ZeRO-3 all-gather moves; 0 = weight_bytes."""
    combine_bytes: int | None = None
    """Bytes per element of a MoE layer's combined expert outputs kept for the gates'
    gradient; None = activation_bytes. 0 where the gates are applied inside the experts
    (Megatron-Core from core_v0.13), 4 where they multiply an fp32 upcast (torchtitan);
    set from the framework's memory facts (:mod:`shardlab.estimate.expert`)."""
    input_bytes: int | None = None
    """Bytes per element of a linear layer's input kept for backward; None = activation_bytes.
    1 where Transformer Engine multiplies in fp8 and keeps the fp8 copy (``plan
    --framework megatron --dtype fp8``; :mod:`shardlab.estimate.activations`)."""

    @property
    def linear_compute(self) -> str:
        """The dtype the linear layers multiply in (``linear``, else ``compute``)."""
        return self.linear or self.compute

    @property
    def is_fp8(self) -> bool:
        """Whether the linear layers multiply in fp8."""
        return self.linear_compute == "fp8"

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
    DtypePolicy("fp8", 2, 2, 12, 2, "bf16", "bf16 mixed precision, linear layers in fp8 "
                "(Transformer Engine / torchao float8; CUDA only)", linear="fp8",
                fp8_copy_bytes=2, gather_bytes=1),
)}


OPTIMIZER_STATES: dict[str, int] = {"fp32": 12, "bf16_moments": 8, "bf16": 4}
"""Adam's state bytes per parameter of a 16-bit-weight policy, by ``optimizer_dtype``
(``shardlab plan --layout``): ``fp32``, an fp32 master weight and both moments in fp32
(the ZeRO paper's K = 12, Sec. 3.1); ``bf16_moments``, the fp32 master with both moments
in bf16 (Megatron-Core's ``--use-precision-aware-optimizer --exp-avg-dtype bf16
--exp-avg-sq-dtype bf16``); ``bf16``, both moments in bf16 and no master apart from the
bf16 weight it updates (Apex ``DistributedFusedAdam(dtype=torch.bfloat16)``, whose
``store_params`` NeMo leaves off when the optimizer's dtype is the model's, as NeMo's
Nemotron-4 340B training config runs it; the ``bf16-pure`` policy's optimizer)."""


def with_optimizer_dtype(policy: DtypePolicy, name: str) -> DtypePolicy:
    """``policy`` with Adam's state in ``name``'s bytes (:data:`OPTIMIZER_STATES`);
    SpecError for an unknown name or a policy whose weights are not 16-bit."""
    key = name.lower()
    if key not in OPTIMIZER_STATES:
        raise SpecError("optimizer_dtype", name, f"must be one of {', '.join(OPTIMIZER_STATES)}")
    if policy.weight_bytes != 2:
        if key == "fp32":
            return policy  # fp32 weights: Adam's fp32 moments are the policy's already
        raise SpecError("optimizer_dtype", name, f"sets the optimizer state beside 16-bit "
                        f"weights: needs --dtype bf16, fp16, fp8 or bf16-pure, not "
                        f"{policy.name}")
    return replace(policy, optimizer_bytes=OPTIMIZER_STATES[key])


def get_policy(name: str) -> DtypePolicy:
    """The policy called ``name`` (exact, case-insensitive)."""
    p = POLICIES.get(name.lower())
    if p is None:
        raise SpecError("dtype", name, f"must be one of {', '.join(POLICIES)}")
    return p
