"""Communication overlap in the step-time model: what each option hides, and each
framework's defaults.

Three options (``--layout`` keys of ``shardlab plan``; :class:`~shardlab.plan.step_time.
StepOptions` fields), each ``off``, ``on`` or the narrower case a framework enables:

* **overlap_dp**: data-parallel gradient reduction (all-reduce or reduce-scatter) runs
  bucket by bucket during the last micro-batch's backward, and the parameter
  all-gather (ZeRO 1-2 after the optimizer, ZeRO-3 before each layer) during the
  forward (Megatron-LM's ``--overlap-grad-reduce`` / ``--overlap-param-gather``;
  FSDP2's prefetch of the next layer's all-gather and reduce-scatter on a side stream;
  DeepSpeed's ``overlap_comm``). Exposed: what is longer than the window it hides
  behind, and never less than one unit's share (the last bucket or layer cannot start
  before the backward ends, the first gather before the forward starts): per unit
  max(comm - window, comm/units), units = the rank's layers. ``zero3``: on for ZeRO-3
  only (DeepSpeed).
* **overlap_tp**: each tensor-parallel all-gather or reduce-scatter is split into t
  chunks that ride alongside the matmul it feeds or drains (Wang et al. 2023, "Overlap
  communication with dependent computation via decomposition"), and only that one: the
  gather before q, k, v beside their matmul, the reduce-scatter after the output
  projection beside it, the MLP's likewise (:class:`~shardlab.plan.layer_time.
  LayerForward` ``tp_windows``). With t chunks the first chunk's matmul has nothing to
  hide: a collective exposes max(0, comm - g·(t-1)/t) beside its matmul's time g (2g
  backward, its data and weight gradients). ``on``: forward and backward (Megatron-LM's
  ``--tp-comm-overlap``, Transformer Engine's userbuffers overlap fprop, dgrad and wgrad);
  ``forward``: the forward passes only, the recomputed one included (torch's async TP,
  torchtitan's ``enable_async_tensor_parallel``, fuses the all-gather-matmul and
  matmul-reduce-scatter patterns of the forward graph: its authors report "up to ~20%
  forward pass speedup and ~8% E2E speedup in Llama3 70B", PyTorch dev-discuss, Aug
  2024). ``overlap_tp=1`` means the framework's kind. The embedding's and head's
  collectives stay exposed.
* **overlap_pp**: pipeline sends and receives of one chunk run while the next chunk
  computes (Megatron-LM's ``overlap_p2p_comm``, used by its interleaved schedule). ``on``:
  every message but the first receive and the last send hides (exposed 2 x one message,
  plus any part of each message longer than a chunk's forward: Megatron's
  ``overlap_p2p_comm_warmup_flush``). ``interleaved`` (Megatron-LM's default): on for
  interleaved schedules only, and only in their steady 1F1B phase: Megatron-Core's
  ``overlap_p2p_comm_warmup_flush`` defaults to False ("if set, overlap pipeline parallel
  communication in warmup and flush", model_parallel_config.py), so the warmup's forward
  messages and the flush's backward messages wait in line: W each on the first stage,
  W = min((p-1)·2 + (v-1)·p, m·v) (schedules.py ``num_warmup_microbatches``, with
  ``microbatch_group_size_per_vp_stage`` at its default p; all m·v when m = p) (:func:
  `pp_unhidden`).

:data:`FRAMEWORKS` gives each framework's defaults (``--framework``), each with where it
comes from; a ``--layout`` key overrides one. Without ``--framework`` the planner keeps
its own defaults (:data:`DEFAULTS`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.errors import SpecError
from shardlab.plan.memory_peak import MemoryFacts

DP_MODES: tuple[str, ...] = ("off", "on", "zero3")
BACKWARD_PREFETCH: tuple[str, ...] = ("pre", "post")
"""``backward_prefetch=``: when ZeRO-3 issues a layer's backward all-gather, as PyTorch FSDP1's
``BackwardPrefetch`` names it: BACKWARD_PRE "prefetches the next set of parameters before
the current set of parameters' gradient computation" (FSDP1's default), BACKWARD_POST
"after the current set of parameters' gradient computation ... enables less overlap"
(torch.distributed.fsdp docs; Composer's ``FSDPConfig.backward_prefetch`` default)."""
FLASH_KERNELS: tuple[str, ...] = ("fa2", "fa3", "triton", "fa1", "fp8")
"""Fused attention kernels a run can name (``flash_kernel=``): FlashAttention-2, -3 (or cuDNN's),
llm-foundry's Triton kernel (``attn_impl: triton``), FlashAttention-1 (flash-attn 0.x) and
an fp8 fused attention (``fp8``: Transformer Engine's ``--fp8-dot-product-attention``, with
``--dtype fp8`` only, priced against the fp8 peak); their shares of the peak are the
accelerator's :attr:`~shardlab.config.hardware.Efficiency.flash_fractions`."""
TORCH_PIPELINING: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v",
                                     "dualpipev")
"""The schedules ``torch.distributed.pipelining`` 2.13 runs (ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble: ZB-H1 with one chunk,
ScheduleZBVZeroBubble, ScheduleDualPipeV; no ZB-H2): torchtitan's and the PyTorch-native
FSDP stacks' (NeMo AutoModel's AutoPipeline is built on it)."""
FUSED_LOSS_BYTES = 6
"""``fused_loss=1``: a run that states a fused cross-entropy kernel (Megatron-LM's
``--cross-entropy-loss-fusion``, Megatron-Bridge's ``cross_entropy_fusion_impl: te``) moves
6 B per logit, forward and backward (:attr:`Framework.loss_bytes`' fused figure)."""
FUSED_LOSS_PEAK = 4.0
"""``fused_loss=1``: bytes per logit element at a fused cross-entropy's peak (the bf16
logits and their bf16 gradient, written over them or beside them): no more than the fp32
logits the saved activations count (:mod:`shardlab.plan.memory_peak`)."""
REDUCE_BYTES: dict[str, int] = {"bf16": 2, "fp32": 4}
"""``reduce_dtype=``: bytes per gradient element of the data-parallel reduction (a run's
stated FSDP policy: torch's ``MixedPrecision.reduce_dtype``)."""
TP_MODES: tuple[str, ...] = ("off", "on", "forward")
PP_MODES: tuple[str, ...] = ("off", "on", "interleaved")


@dataclass(frozen=True)
class Framework:
    """A training framework's defaults for the step-time options, and their sources."""

    name: str
    overlap_dp: str
    overlap_tp: str
    overlap_pp: str
    fused_norm: bool
    fused_accumulation: bool
    source: str
    tp_overlap_kind: str = "on"
    """What ``overlap_tp=1`` turns on in this framework: ``on`` (forward and backward) or
    ``forward``."""
    grad_reduce_bytes: int = 0
    """Bytes per gradient element its data-parallel reduction moves when the compute dtype is
    bf16 (0: the dtype policy's): Megatron-LM "bfloat16 requires gradient accumulation and
    all-reduce to be done in fp32" (arguments.py, unless --grad-reduce-in-bf16); FSDP's
    mixed precision reduces in fp32 in torchtitan (``mixed_precision_reduce = "float32"``)
    and Composer's DEFAULT policy."""
    flash_kernel: str = "fa3"
    """The fused attention kernel it calls: ``fa2`` (FlashAttention-2, torch SDPA's flash
    backend) or ``fa3`` (FlashAttention-3 or cuDNN's fused attention, as Transformer Engine
    calls it on Hopper); a run's ``flash_kernel=`` key names another (:data:`FLASH_KERNELS`)."""
    fp8_cast_bytes: int = 7
    """Bytes an fp8 operand's cast moves per element (:mod:`shardlab.estimate.fp8`): 7 for
    torchao's separate amax, cast and transpose kernels; 3 where Transformer Engine fuses the
    cast into the kernel that produces the operand (LayerNormLinear, LayerNormMLP, delayed
    scaling's amax taken in the same pass) and only the transposed copy is a pass of its own."""

    reduce_each_micro: bool = False
    """With ZeRO-3 and gradient accumulation, whether it reduce-scatters the gradients after
    every micro-batch (FSDP without ``no_sync``), not once after the last. Composer runs FSDP
    modules without a sync context (composer/trainer/trainer.py ``_train_microbatch``:
    ``sync_context = contextlib.nullcontext()`` for a model that is not DDP, commit 1bc8d0aa,
    Jan 2024); torchtitan's accumulation loop calls ``backward`` per micro-batch and never
    ``set_requires_gradient_sync`` (train.py, commit 2887250b); Megatron-LM runs all but the
    last micro-batch under ``no_sync``. It also marks torch's FSDP in
    torch.distributed.pipelining's stages, which gather once a step and reduce-scatter once,
    after the stage's last backward (:mod:`shardlab.plan.dp_time`)."""
    loss_bytes: int = 6
    """Bytes its loss moves per logit element, forward and backward (each operator reads
    its inputs and writes its output once): 6 for a fused cross-entropy kernel on the bf16
    logits (read them forward, read them and write their gradient backward: flash-attn's
    ``CrossEntropyLoss``, llm-foundry's ``fused_crossentropy``); 52 for Megatron-Core's
    unfused ``VocabParallelCrossEntropy`` (core_r0.8.0 tensor_parallel/cross_entropy.py:
    ``.float()`` 2 + 4, max 4, ``sub_`` 8, ``exp`` 8, sum 4, ``div_`` 8; backward ``mul_`` 8
    and the cast back 4 + 2; ``--cross-entropy-loss-fusion`` is store_true, off); 36 for
    torchtitan's ``cross_entropy(pred.float(), labels)`` (cast 2 + 4, log_softmax 4 + 4;
    backward the nll gradient's fill 4, log_softmax_backward 8 + 4, the cast back 4 + 2)."""
    selective: str = "attention"
    """What its selective recompute runs again (:class:`~shardlab.plan.step_inputs.
    StepOptions`): ``attention`` or ``op`` (torchtitan's per-operator checkpointing)."""
    moe_sequence_split: bool = False
    """Whether a MoE layer with whole experts (etp 1) and no shared expert routes each tensor
    rank's own sequence-parallel tokens, with no all-gather before it and no reduce-scatter
    after it: Megatron-LM's dispatchers gather only over the expert tensor-parallel group
    (``MoETokenDispatcher.tp_group = model_comm_pgs.expt_tp``; ``gather_from_sequence_
    parallel_region`` only when its size > 1, token_dispatcher.py at 1e057005) and its
    MoELayer requires sequence parallelism with tensor parallelism in training. torchtitan
    gathers the block's input ("all-gather for input, reduce-scatter for output": its
    ``apply_moe_ep_tp`` plan, ``PrepareModuleInputOutput`` from Shard(1) to Replicate):
    False there and in the planner's defaults."""

    memory: MemoryFacts | None = None
    """What it holds at its memory peak (:mod:`shardlab.plan.memory_peak`); None: the
    planner counts states and saved activations only."""
    cp_expanded_kv: bool = False
    """Whether its context parallel moves K and V repeated to every query head, gathers
    them again in backward and passes their gradients around the ring in fp32: torchtitan
    9dec370 calls ``repeat_kv`` before SDPA (models/llama/model.py), and torch 2.6's
    ``context_parallel`` (distributed/tensor/experimental/_attention.py) all-gathers K/V
    forward and again in backward (rotate method ``allgather``, torchtitan's default) and
    rotates dK/dV in fp32 (``convert_to_f32``). Megatron-LM's ring passes the kv heads."""

    expert_launches: bool = False
    """Whether each local expert's matmuls are kernel launches of their own: Megatron-Core's
    default experts (``moe_use_legacy_grouped_gemm`` False: ``TEGroupedMLP``, Transformer
    Engine's GroupedLinear, "Multi-stream launch of cuBLASLt GEMMs": the MoE report, arXiv
    2603.07685, Sec. 4.3.2). torchtitan's experts are one ``torch._grouped_mm`` kernel
    per matmul, as the planner's default counts them."""
    expert_fold: bool = False
    """Whether its expert layers take their own mesh over each pipeline stage's tp x cp x dp
    ranks ("parallel folding"): each expert split etp ways (etp innermost), ep groups of
    consecutive etp-strided ranks, the rest expert data parallel, so ep need only divide
    tp·cp·dp/etp and an expert's states shard over tp·cp·dp/(ep·etp) replicas. Megatron-Core
    (parallel_state.py at d98e8a64: ``expert_decoder_rank_generator = RankGenerator(
    tp=expert_tensor_parallel_size, ep=expert_model_parallel_size, dp=expert_data_parallel_
    size, ...)``, ``expert_data_parallel_size = world_size // expert_tensor_model_pipeline_
    parallel_size``; the MoE report, arXiv 2603.07685, Section 3.3) and torchtitan
    (parallel_dims.py at b5bcd76c: the sparse mesh ``["pp", "dp_replicate", "efsdp", "ep"]``,
    "expert_parallel_degree must divide dp_shard * cp * tp", ``efsdp = fsdp * tp // ep``).
    Without it (shardlab's own runtime, DeepSpeed) the ep group is drawn from dp and an
    expert is replicated over dp/ep x cp ranks."""
    schedules: tuple[str, ...] | None = None
    """The pipeline schedules it runs (names of :data:`shardlab.config.layout.SCHEDULES`;
    None: any): ``plan`` searches only these, and a ``--layout`` or ``--schedules`` naming
    another is refused."""
    context_parallel: bool = True
    """Whether it runs context parallelism as the planner prices it (each rank a chunk of
    every sequence, K and V gathered or passed around a ring); DeepSpeed's sequence
    parallelism is DeepSpeed-Ulysses' all-to-all over attention heads instead
    (deepspeed/sequence/layer.py ``DistributedAttention``), not priced: cp stays 1."""
    pipeline_max_zero: int | None = None
    """The highest ZeRO stage it runs with pipeline parallelism (None: as :attr:`zero`):
    DeepSpeed's PipelineEngine asserts ``zero_optimization_stage() < 2`` ("ZeRO-2 and
    ZeRO-3 are incompatible with pipeline parallelism", deepspeed/runtime/pipe/engine.py)."""
    zero: tuple[int, ...] | None = None
    """The ZeRO stages it runs (None: 0-3), likewise: PyTorch FSDP's sharding strategies
    are NO_SHARD, SHARD_GRAD_OP and FULL_SHARD (ZeRO 0, 2, 3: no optimizer-only sharding),
    and torchtitan's DDP and FSDP2 without or with resharding after forward."""

    def options(self) -> dict[str, object]:
        """The options as StepOptions keywords."""
        return {"overlap_dp": self.overlap_dp, "overlap_tp": self.overlap_tp,
                "overlap_pp": self.overlap_pp, "fused_norm": self.fused_norm,
                "fused_accumulation": self.fused_accumulation,
                "fp8_cast_bytes": self.fp8_cast_bytes, "flash_kernel": self.flash_kernel,
                "grad_reduce_bytes": self.grad_reduce_bytes, "selective": self.selective,
                "loss_bytes": self.loss_bytes, "reduce_each_micro": self.reduce_each_micro,
                "moe_sequence_split": self.moe_sequence_split, "memory": self.memory,
                "cp_expanded_kv": self.cp_expanded_kv,
                "expert_launches": self.expert_launches}


FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework(
        "megatron", "off", "off", "interleaved", True, True, fp8_cast_bytes=3,
        grad_reduce_bytes=4, loss_bytes=52, moe_sequence_split=True, expert_fold=True,
        expert_launches=True,
        # megatron/core/pipeline_parallel/schedules.py (d98e8a64): no pipelining,
        # forward_backward_pipelining_without_interleaving (1F1B) and _with_interleaving.
        schedules=("1f1b", "interleaved-1f1b"),
        memory=MemoryFacts(loss_bytes=6.0, held_grad_bytes=4, reduce_bytes=4,
                           fp8_input_bytes=1, combine_bytes=0, source=
            "bf16 gradients accumulate in fp32 main_grad buffers (arguments.py: 'bfloat16 "
            "requires gradient accumulation and all-reduce to be done in fp32'); the "
            "vocab-parallel cross-entropy casts the bf16 logits to fp32 and works in place "
            "on them (core_r0.8.0 tensor_parallel/cross_entropy.py: '.float()', 'In-place "
            "subtraction reduces memory pressure', exp out=): 2 + 4 B per logit at its "
            "peak; in fp8, Transformer Engine's linear layers save the fp8 copy of their "
            "input (TE v1.8 linear.py 'saved_inputmat_t = inputmat_t'; v2.8 "
            "'inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)'); a MoE "
            "layer's gates multiply inside the experts' activation (core_v0.13.0, "
            "'Memory efficient token permutation': WeightedSwiGLUFunction saves the fc1 "
            "output and the gates), so the combine keeps no expert outputs"), source=
        "Megatron-LM megatron/training/arguments.py: --overlap-grad-reduce and "
        "--overlap-param-gather are store_true (default off), --tp-comm-overlap store_true "
        "(off), --no-overlap-p2p-communication store_false into overlap_p2p_comm (on; the "
        "interleaved schedule uses it, in its steady phase only: ModelParallelConfig."
        "overlap_p2p_comm_warmup_flush = False), --no-gradient-accumulation-fusion store_false "
        "(fusion on); norms are Transformer Engine / Apex fused kernels"),
    Framework(
        "torchtitan", "on", "off", "off", False, False, tp_overlap_kind="forward",
        flash_kernel="fa2", grad_reduce_bytes=4, selective="op", loss_bytes=36,
        schedules=TORCH_PIPELINING, zero=(0, 2, 3),
        reduce_each_micro=True, cp_expanded_kv=True, expert_fold=True,
        memory=MemoryFacts(loss_bytes=12.0, reduce_bytes=4, fsdp2_root=True,
                           combine_bytes=4, parallel_loss_bytes=16.0, sp_gathered_inputs=2,
                           source=
            "torchtitan 9dec370: the bf16 logits go to cross_entropy(pred.float()) and "
            "'del pred' before backward (train.py), so log_softmax's saved fp32 output, the "
            "nll gradient and log_softmax_backward's fp32 result meet at 12 B per logit; "
            "FSDP2's final norm and output one unit kept gathered after forward, the "
            "embedding and the blocks resharded after forward except with pp (distributed/"
            "fsdp.py at b5bcd76c: reshard_after_forward False for [norm, lm_head] unless "
            "the policy is 'always'), reduce_dtype float32 (parallelize_llama.py); the MoE "
            "scores multiply an fp32 upcast of the routed rows (moe.py, eca011c03: "
            "'routed_output.to(torch.float32) * top_scores_experts_sorted'), kept for "
            "their gradient; with tp, loss_parallel's DTensor cross-entropy (torch "
            "distributed/tensor/parallel/loss.py: '(grad_input + torch.exp(x)) * "
            "grad_output' over zeros_like(x)) peaks at 16 B per local logit in backward "
            "(saved fp32 log-probs, zeros, exp, the sum; measured on CPU with torch 2.9.1); "
            "DTensor's sequence parallelism keeps the all-gathered input of the attention "
            "(shared by wq, wk, wv) and of the FFN (w1, w3) whole for their backward "
            "(benchmarks/sp_saved_inputs.py, torch 2.13.0 on CPU: the gathered input saved "
            "once at 1.00 x T·h beside a 0.25 x T·h shard at tp 4), in fp8 under torchao's "
            "tensorwise fp8 TP (it casts before the all-gather), gathered again only when "
            "the layer is checkpointed"),
        source=
        "torchtitan: FSDP2 prefetches the next layer's all-gather and reduce-scatters on a "
        "side stream (no flag); parallelism.enable_async_tensor_parallel defaults to False; "
        "torch.distributed.pipelining posts a stage's receive just before its compute; "
        "RMSNorm runs in eager torch unless compile.enable (default false); gradients of "
        "micro-batches accumulate in a separate add; selective activation checkpointing "
        "'op' saves every other mm; the loss is cross_entropy on the logits cast to fp32"),
    Framework(
        "fsdp", "on", "off", "off", False, False, tp_overlap_kind="forward", fp8_cast_bytes=3,
        flash_kernel="fa2", grad_reduce_bytes=4, reduce_each_micro=True,
        schedules=TORCH_PIPELINING, zero=(0, 2, 3),
        source=
        "PyTorch FSDP outside torchtitan (Composer, fms-fsdp, Accelerate): as torchtitan, "
        "FSDP's backward and forward prefetch overlap the all-gathers and reduce-scatters; "
        "no tensor or pipeline parallelism of its own in Composer and fms-fsdp (NeMo "
        "AutoModel pipelines with torch.distributed.pipelining: AutoPipeline); eager norms "
        "unless compiled; "
        "Composer reduce-scatters after every micro-batch and llm-foundry's "
        "fused_crossentropy is one kernel over the bf16 logits"),
    Framework(
        "deepspeed", "zero3", "off", "off", True, False, fp8_cast_bytes=3, flash_kernel="fa2",
        # deepspeed/runtime/pipe/schedule.py: TrainSchedule, 1F1B (PipeDream-Flush).
        loss_bytes=52, schedules=("1f1b",), context_parallel=False, pipeline_max_zero=1,
        source=
        "DeepSpeed deepspeed/runtime/zero/config.py: overlap_comm left unset becomes "
        "stage == 3 (on for ZeRO-3 only); tensor parallelism from Megatron-DeepSpeed runs "
        "synchronously; the pipeline engine's sends and receives block; fused norms from "
        "Megatron-DeepSpeed; gradients accumulate in DeepSpeed's own buffers"),
)}

DEFAULTS = Framework("none", "on", "off", "off", True, True, source=
                     "shardlab's defaults without --framework: data-parallel communication "
                     "overlapped, tensor- and pipeline-parallel on the critical path, fused "
                     "norms and gradient accumulation")


def framework(name: str | None) -> Framework:
    """The framework ``name`` (None: :data:`DEFAULTS`); one-line SpecError naming the
    known ones otherwise."""
    if name is None:
        return DEFAULTS
    key = name.lower()
    if key not in FRAMEWORKS:
        raise SpecError("framework", name, f"must be one of {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[key]


_WORDS: dict[str, str] = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off",
                          "no": "off"}


def mode(field: str, value: object, allowed: tuple[str, ...]) -> str:
    """An overlap option as one of ``allowed``: True, 1, yes -> "on"; False, 0, no -> "off";
    a mode by name as it is. SpecError otherwise."""
    text = str(value).lower()
    text = _WORDS.get(text, text)
    if text not in allowed:
        raise SpecError(field, value, f"must be 0 or 1 (or {', '.join(allowed)})")
    return text


def dp_on(value: str, zero: np.ndarray) -> np.ndarray:
    """Per layout: whether overlap_dp ``value`` overlaps at this ZeRO stage."""
    return np.full(len(zero), value == "on") | ((value == "zero3") & (zero == 3))


def pp_on(value: str, virtual: np.ndarray) -> np.ndarray:
    """Per layout: whether overlap_pp ``value`` overlaps (``interleaved``: v > 1)."""
    return np.full(len(virtual), value == "on") | ((value == "interleaved") & (virtual > 1))


def hidden_behind(comm: np.ndarray, window: np.ndarray, units: np.ndarray,
                  on: np.ndarray) -> np.ndarray:
    """Exposed seconds of ``comm`` overlapped (where ``on``) with ``window`` seconds of
    compute, in ``units`` pieces of which the last cannot overlap:
    max(comm - window, comm/units); all of it where not ``on``."""
    exposed = np.maximum(comm - window, comm / np.maximum(units, 1.0))
    return np.where(on & (comm > 0), exposed, comm)


def nvlink_waits(*waits: tuple[np.ndarray, np.ndarray], dp_inside: np.ndarray
                 ) -> np.ndarray:
    """Seconds per micro-batch the compute stream waits on collectives that stay on NVLink
    (each ``(seconds, inside a node)`` pair: tensor, expert, context parallel), where the
    data-parallel ring leaves the node (``dp_inside`` False), else 0. Such a ring runs on
    its own stream over the network, another link, so it progresses through those waits
    as through compute: they widen its window (:mod:`shardlab.plan.step_time`, dp_comm)."""
    total = sum(np.where(inside, secs, 0.0) for secs, inside in waits)
    return np.where(dp_inside, 0.0, np.asarray(total, float))


def tp_exposed(comm_fwd: np.ndarray, comm_bwd: np.ndarray, gemm_fwd: np.ndarray,
               tp: np.ndarray, kind: str) -> np.ndarray:
    """Exposed seconds of a tensor-parallel collective (forward + backward) beside the
    matmul it feeds or drains, ``gemm_fwd`` forward and twice that backward, under overlap
    ``kind`` (off, on, forward: module docstring)."""
    share = (tp - 1.0) / tp
    fwd = comm_fwd if kind == "off" else np.maximum(comm_fwd - gemm_fwd * share, 0.0)
    bwd = comm_bwd if kind != "on" else np.maximum(comm_bwd - 2.0 * gemm_fwd * share, 0.0)
    return fwd + bwd


def pp_unhidden(value: str, pp: np.ndarray, virtual: np.ndarray, micro: np.ndarray
                ) -> np.ndarray:
    """Point-to-point messages per step on the first pipeline rank that overlap_pp ``value``
    cannot hide (module docstring): 2 (the first receive, the last send) under ``on``; under
    ``interleaved`` the warmup's and the flush's, 2·W with W = min((p-1)·2 + (v-1)·p, m·v)
    (m·v when m = p), Megatron-Core's first-stage warmup count; where overlap_pp is off the
    caller exposes them all."""
    p, v, m = (np.asarray(x, float) for x in (pp, virtual, micro))
    warmup = np.where(m == p, m * v, np.minimum(2.0 * (p - 1) + (v - 1) * p, m * v))
    return np.where(value == "interleaved", 2.0 * warmup, 2.0)


def pp_exposed(message: np.ndarray, messages: np.ndarray, chunk_fwd: np.ndarray,
               value: str, pp: np.ndarray, virtual: np.ndarray, micro: np.ndarray
               ) -> np.ndarray:
    """Exposed point-to-point seconds under overlap_pp ``value``: all ``messages`` x
    ``message`` where it does not overlap (:func:`pp_on`), else the :func:`pp_unhidden`
    ones plus what each of the others exceeds a chunk's forward by."""
    on = pp_on(value, np.asarray(virtual))
    unhidden = pp_unhidden(value, pp, virtual, micro)
    hidden = np.maximum(messages - unhidden, 0.0)
    overlapped = unhidden * message + hidden * np.maximum(message - chunk_fwd, 0.0)
    return np.where(on, np.minimum(overlapped, messages * message), messages * message)
