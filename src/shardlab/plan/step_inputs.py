"""What the step-time model takes besides the layouts: the device and the options.

:class:`Device` is one accelerator as :mod:`shardlab.plan.step_time` sees it (peaks,
bandwidths, links, the efficiency curve, this machine's measured runtime);
:class:`StepOptions` are the framework's choices that change time (a fused attention
kernel, communication overlap, fused norms and gradient accumulation, fp8 casts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.config.hardware import Efficiency, Link
from shardlab.config.runtime import Runtime
from shardlab.errors import SpecError
from shardlab.estimate import fp8
from shardlab.plan.comm_time import pick_link
from shardlab.plan.memory_peak import MemoryFacts
from shardlab.plan.overlap import BACKWARD_PREFETCH, DP_MODES, PP_MODES, TP_MODES, mode
from shardlab.plan.space import Candidates

RING_COLLECTIVES: frozenset[str] = frozenset({"all_reduce", "reduce_scatter", "all_gather"})
"""The collectives NCCL runs as rings that leave a node through several members' NICs
(:mod:`shardlab.plan.comm_time`); all-to-all and send use one NIC per device."""
MEASURED_AS: dict[str, str] = {"all_to_all": "all_gather"}
"""Collectives this machine's runtime does not time, and the measured one whose rate they
take: an all-to-all moves (p-1)/p of each rank's buffer, as an all-gather does."""


@dataclass(frozen=True)
class Device:
    """One device as the step-time model sees it: dense peak (FLOP/s) in the compute dtype
    and in the linear layers' dtype (``linear_peak``, fp8; 0: the same), memory bandwidth
    (bytes/s), links, devices per node, the efficiency curve and, for this machine, its
    measured runtime (collective rates and fixed costs per parallel style)."""

    peak: float
    memory_bandwidth: float
    intra: Link
    inter: Link
    gpus_per_node: int
    eff: Efficiency
    runtime: Runtime | None = None
    elementwise_bandwidth: float = 0.0
    """Bytes/s at which the memory-bound operators' counted bytes move; 0: the memory
    bandwidth. This machine's comes from its measured layer
    (:func:`shardlab.plan.layer_time.probe_elementwise_bandwidth`)."""
    linear_peak: float = 0.0
    host_link: Link | None = None
    """The accelerator's link to host memory (activation offloading); None: not known."""

    def link(self, collective: str, inside: np.ndarray,
             per_node: np.ndarray | float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(latency s, bandwidth bytes/s) of ``collective`` per layout: the measured gloo fit
        without its latency when there is one (the runtime's fixed costs hold it), else
        the intra-node link where ``inside`` and the inter-node one elsewhere, a ring
        collective's (all-reduce, reduce-scatter, all-gather) over the NICs of its
        ``per_node`` members in each node (:func:`shardlab.plan.comm_time.pick_link`)."""
        if self.runtime is not None:
            bandwidth = self.runtime.collectives[MEASURED_AS.get(collective, collective)][1]
            return np.zeros(len(inside)), np.full(len(inside), bandwidth)
        nics = per_node if collective in RING_COLLECTIVES else 1.0
        return pick_link(inside, self.intra, self.inter, self.eff.link_fraction, nics)


@dataclass(frozen=True)
class StepOptions:
    """``flash``: a fused attention kernel (its backward recomputes half the core);
    ``overlap_dp`` (off, on, zero3), ``overlap_tp`` (off, on, forward), ``overlap_pp``
    (off, on, interleaved): what communication hides behind compute
    (:mod:`shardlab.plan.overlap`; True/False read as on/off); ``fused_norm``: RMSNorm in
    one fused kernel, else eager torch's passes; ``fused_accumulation``: the
    weight-gradient matmul adds into the held gradient (Megatron's gradient-accumulation
    fusion), else each micro-batch's gradients are added in a separate pass."""

    flash: bool = True
    overlap_dp: bool | str = True
    fused_accumulation: bool = True
    overlap_tp: bool | str = False
    overlap_pp: bool | str = False
    fused_norm: bool = True
    fp8_cast_bytes: int = fp8.ACTIVATION_CAST_BYTES
    """Bytes an fp8 operand's cast moves per element (the framework's; 7: torchao; a named
    ``fp8_recipe``'s: :data:`shardlab.estimate.fp8.RECIPE_CAST_BYTES`)."""
    fp8_recipe: str = ""
    """The Transformer Engine fp8 recipe a run names (delayed, tensorwise, mxfp8); "": the
    framework's casts."""
    flash_kernel: str = "fa3"
    """The fused attention kernel (fa2, fa3, triton, fa1; fp8 against the fp8 peak): the most
    of the peak it reaches is the accelerator's
    :attr:`~shardlab.config.hardware.Efficiency.flash_fractions`."""
    grad_reduce_bytes: int = 0
    """Bytes per gradient element the data-parallel reduction moves with bf16 compute (the
    framework's: fp32 reduction is 4); 0: the policy's gradient bytes."""
    reduce_each_micro: bool = False
    """ZeRO-3 reduce-scatters the gradients after every micro-batch's backward (PyTorch FSDP
    without ``no_sync``: Composer, torchtitan), not once after the last; with pp > 1 (torch's
    pipeline stages) FSDP gathers once a step and reduce-scatters once, exposed, after the
    stage's last backward (:mod:`shardlab.plan.dp_time`)."""
    loss_bytes: int = 6
    """Bytes the loss moves per logit element, forward and backward (the framework's:
    :attr:`shardlab.plan.overlap.Framework.loss_bytes`; 6: a fused kernel)."""
    selective: str = "attention"
    """What selective recompute runs again: ``attention`` (the attention core, Korthikanti
    et al. 2022: Megatron-LM) or ``op`` (torchtitan's per-operator policy: every second
    linear matmul, :func:`shardlab.plan.layer_time.op_checkpoint_matmuls`)."""
    dispatcher: str = "alltoall"
    """The MoE token dispatcher (``alltoall``, ``flex``: :mod:`shardlab.plan.expert_time`)."""
    routing: str = "random"
    """How a balanced run draws a token's experts (``random``, ``contiguous``:
    :mod:`shardlab.plan.expert_time`)."""
    memory: MemoryFacts | None = None
    """The framework's memory facts (:mod:`shardlab.plan.memory_peak`): what the planner's
    memory per device adds at the framework's peak; None: states and saved activations."""
    moe_sequence_split: bool = False
    """A MoE layer with whole experts (etp 1) and no shared expert dispatches each tensor
    rank's own sequence-parallel tokens, so it runs no tensor-parallel collective around
    its MLP (Megatron-LM: :attr:`shardlab.plan.overlap.Framework.moe_sequence_split`)."""
    expert_launches: bool = False
    """Each local expert's matmuls launch apart (Megatron-Core's Transformer Engine experts:
    :attr:`shardlab.plan.overlap.Framework.expert_launches`); else one grouped kernel each."""
    overlap_ep: bool = False
    """The MoE all-to-alls overlapped with another micro-batch's compute, as Megatron-Core's
    ``--overlap-moe-expert-parallel-comm`` runs them (:func:`shardlab.plan.expert_time.
    ep_overlap`); off in every framework's defaults (Megatron's flag is store_true)."""
    recompute_modules: tuple[str, ...] = ()
    """Under selective recompute, Megatron-Core's ``--recompute-modules`` run again in
    backward (:data:`shardlab.estimate.activations.RECOMPUTE_MODULES`); (): the framework's
    selective (Korthikanti's attention core, or torchtitan's per-operator policy)."""
    offload_layers: int = 0
    """Layers per rank whose saved activations go to host memory and back (Megatron-Core's
    ``--cpu-offloading-num-layers``: :mod:`shardlab.plan.offload`); 0: none."""
    fp8_params: bool = False
    """fp8 primary weights (Megatron's ``--fp8-param-gather``: "keep the compute param in
    fp8 ... and perform the param all-gather in fp8"; Transformer Engine's
    ``fp8_model_init``, whose fp8 weight keeps its transpose): each linear weight held as
    fp8 and its fp8 transpose, no bf16 copy, and the distributed optimizer's parameter
    all-gather moves it in fp8 (:mod:`shardlab.plan.memory`); only with the fp8 policy."""
    backward_prefetch: str = "pre"
    """When ZeRO-3 gathers a layer's weights in backward (PyTorch FSDP1's ``BackwardPrefetch``):
    ``pre`` before the previous layer's gradient computation, beside it (FSDP1's default;
    FSDP2 and Megatron prefetch so too), ``post`` only after it ("enables less overlap":
    Composer's default), so each gather waits in line (:data:`shardlab.plan.overlap.
    BACKWARD_PREFETCH`)."""
    cp_expanded_kv: bool = False
    """Context parallel as torch's ``context_parallel`` runs under torchtitan: K and V
    repeated to every query head before attention, gathered again in backward, their
    gradients passed around the ring in fp32
    (:attr:`shardlab.plan.overlap.Framework.cp_expanded_kv`)."""

    def __post_init__(self) -> None:
        for name, allowed in (("overlap_dp", DP_MODES), ("overlap_tp", TP_MODES),
                              ("overlap_pp", PP_MODES)):
            object.__setattr__(self, name, mode(name, getattr(self, name), allowed))
        if self.backward_prefetch not in BACKWARD_PREFETCH:
            raise SpecError("backward_prefetch", self.backward_prefetch,
                            f"must be one of {', '.join(BACKWARD_PREFETCH)}")


def runtime_overhead(rt: Runtime, c: Candidates, micro: np.ndarray, layers: np.ndarray
                     ) -> np.ndarray:
    """Seconds per step of the measured runtime's fixed costs (:mod:`shardlab.plan.step_time`,
    "overhead"): the eager base plus what each parallel style in use adds to it, at the
    rank's ``layers`` and ``micro`` micro-batches."""
    base = rt.overheads["ddp"].seconds(micro, layers)
    total = base.copy()
    for style, used in (("fsdp", (c.dp * c.cp > 1) & (c.zero >= 1)), ("tp", c.tp > 1),
                        ("pp", c.pp > 1)):
        extra = np.maximum(rt.overheads[style].seconds(micro, layers) - base, 0.0)
        total = total + np.where(used, extra, 0.0)
    return total
