"""What a training run is (:class:`TrainConfig`) and the checks it passes before any rank starts.

Free of torch (it reads only shardlab's vocabulary), so the command line can build its
choices and refuse a bad run from these without importing torch.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field

from shardlab.config.layout import make_layout
from shardlab.config.model import MOE_ROUTINGS, ModelShape, require_buildable
from shardlab.errors import SpecError

DP_MODES = ("fsdp", "fsdp-zero2", "ddp")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
FAIL_HOW = ("raise", "kill", "kill-in-save")
TRAIN_DTYPES = ("fp32", "bf16", "fp8")
"""``train --dtype``: fp32; bf16 mixed precision (fp32 parameters and gradients, bf16
compute); fp8, the bf16 run whose linear layers multiply in fp8 (:mod:`shardlab.train.fp8`)."""
TRAIN_RECOMPUTE = ("none", "selective", "full", "op")
"""``train --recompute``: nothing; Korthikanti's selective (the attention core); full (each
block's forward again); op, torchtitan's per-operator selective checkpointing (the outputs
of matmuls, attention kernels and reduce-scatters kept, every second matmul run again:
:mod:`shardlab.distributed.op_policy`)."""
AUX_COEF = 0.01
"""The load-balancing loss's default weight: Switch Transformer's alpha = 1e-2 (Fedus et al.
2021, sec. 2.2), on the same normalisation (1 when routing is uniform); Mixtral's HF
config has 0.02 on a form k times larger, i.e. a smaller weight for top-2."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs, validated by :func:`check_config` before any rank starts."""

    shape: ModelShape
    dp: int = 1
    tp: int = 1
    pp: int = 1
    # Mixture of experts (shardlab.distributed.expert_parallel): ep ranks drawn from dp
    # each hold experts/ep of every MoE layer; etp 1 keeps experts whole on each tp rank,
    # etp = tp splits each expert's width over tp as the dense MLP's.
    ep: int = 1
    etp: int = 1
    capacity_factor: float = 0.0  # 0: dropless
    # learned (the router's top-k) or contiguous (forced balance: shardlab.nn.moe_contiguous)
    routing: str = "learned"
    aux_coef: float = AUX_COEF
    z_coef: float = 0.0
    virtual_stages: int = 1
    # Context parallel (shardlab.distributed.context_parallel): every sequence split over
    # cp ranks, two balanced chunks each; FSDP then shards over dp x cp.
    cp: int = 1
    # Layers of each of the pp x virtual_stages pipeline stages (empty: the even split).
    stage_layers: tuple[int, ...] = ()
    # HSDP: dp = dp_replicate replicas x dp/dp_replicate shards (FSDP2 on a 2-D mesh).
    dp_replicate: int = 1
    dp_mode: str = "fsdp"
    sp: bool = False
    loss_parallel: bool = False
    # none, selective (Korthikanti's attention core), full, or op (torchtitan's
    # per-operator checkpointing: shardlab.distributed.op_policy).
    recompute: str = "none"
    schedule: str = "1f1b"
    global_batch: int = 8
    micro_batch: int = 0  # 0: the whole dp share at once (no accumulation)
    seq: int = 32
    steps: int = 20
    lr: float = 3e-3
    warmup: int = 2
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    dtype: str = "fp32"
    fp8_all_gather: bool = False  # FSDP2 gathers the fp8 linears' weights in fp8 (torchao)
    seed: int = 0
    log_dir: str = ""
    tensorboard: str = ""  # rank 0 writes TensorBoard event files here (train/tensorboard.py)
    peak_flops: float = 0.0  # the job's dense peak FLOP/s, for MFU (0: unknown)
    # Fault injection (tests): rank ``fail_rank`` fails once ``fail_at_step`` steps are
    # done, by raising, by SIGKILL, or by SIGKILL in the middle of that step's save; only
    # on the first attempt, so a restarted job (``--max-restarts``) gets past it.
    fail_at_step: int = -1
    fail_rank: int = -1
    fail_how: str = "raise"
    attempt: int = 0
    # Checkpoints (shardlab.distributed.checkpoint): every K steps and after the last one.
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    keep: int = 3
    # In the background where memory allows (shardlab.distributed.checkpoint_async); a run
    # with an injected fault saves synchronously (__post_init__).
    async_save: bool = True
    resume_from: str = ""  # a checkpoint folder, verified before any rank starts
    init_from: str = ""  # safetensors weights in shardlab's names (``shardlab import``)
    data_id: str = ""  # the corpus's fingerprint, recorded with the data position
    docs: list[list[int]] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Fault injection (the hidden test flags) saves synchronously, so the checkpoint a
        # fault restarts from does not depend on whether a background write had finished.
        if self.fail_at_step >= 0 and self.async_save:
            object.__setattr__(self, "async_save", False)
        # torch's async save stages torchao's fp8 weight wrapper wrongly (its copy of an
        # fp8-gathered weight is not the run's: the resumed loss turns NaN): save in step.
        if self.fp8_all_gather and self.async_save:
            object.__setattr__(self, "async_save", False)

    @property
    def world(self) -> int:
        """Ranks: dp * cp * tp * pp."""
        return self.dp * self.cp * self.tp * self.pp

    @property
    def grad_ranks(self) -> int:
        """Ranks a parameter's gradient is averaged over: dp x cp (the cp ranks of a
        replica hold the same parameters)."""
        return self.dp * self.cp

    @property
    def zero(self) -> int:
        """The ZeRO stage the run's data parallelism is: 3 (fsdp), 2 (fsdp-zero2), 0 (ddp,
        or nothing to shard over)."""
        if self.grad_ranks == 1:
            return 0
        return {"fsdp": 3, "fsdp-zero2": 2, "ddp": 0}.get(self.dp_mode, 0)

    @property
    def microbatches(self) -> int:
        """Micro-batches per data-parallel rank and step."""
        share = self.global_batch // self.dp
        return share // (self.micro_batch or share)


def auto_micro_batch(global_batch: int, dp: int, pp: int, schedule: str) -> int:
    """``--micro-batch 0`` in a pipeline (pp > 1): the largest micro-batch (sequences) that
    still gives the schedule enough micro-batches: at least pp of them (1F1B needs pp to
    fill its pipeline; GPipe with fewer leaves stages idle), a multiple of pp for
    interleaved 1F1B.
    Without a pipeline, 0 stays 0 (a data-parallel rank's whole share, no accumulation).
    SpecError when each rank's share of the global batch is too small for any."""
    if pp == 1 or global_batch % dp:
        return 0  # nothing to choose, or check_config names the bad global batch
    share = global_batch // dp
    for m in range(pp, share + 1):  # fewest micro-batches first: the largest matmuls
        if share % m == 0 and (schedule != "interleaved-1f1b" or m % pp == 0):
            return share // m
    multiple = " (a multiple of pp)" if schedule == "interleaved-1f1b" else ""
    raise SpecError("global_batch", global_batch, f"gives each data-parallel rank {share} "
                    f"sequences, which no count of at least pp={pp} micro-batches{multiple} "
                    f"divides ({schedule}); use a multiple of {pp * dp}")


def check_config(cfg: TrainConfig) -> None:
    """Every constraint the mesh and the model impose, as one-line SpecErrors."""
    require_buildable(cfg.shape)  # before any rank starts
    check_moe(cfg)
    if cfg.dp_mode not in DP_MODES:
        raise SpecError("dp_mode", cfg.dp_mode, f"must be one of {', '.join(DP_MODES)}")
    if cfg.pp > 1 and cfg.schedule not in PP_SCHEDULES:
        raise SpecError("schedule", cfg.schedule, f"must be one of {', '.join(PP_SCHEDULES)}")
    if cfg.recompute not in TRAIN_RECOMPUTE:
        raise SpecError("recompute", cfg.recompute,
                        f"must be one of {', '.join(TRAIN_RECOMPUTE)}")
    if cfg.recompute == "op" and cfg.shape.moe is not None:
        raise SpecError("recompute", "op", "is built for dense models only (a MoE layer's "
                        "experts are a loop of matmuls here); use selective or full")
    if cfg.dtype not in TRAIN_DTYPES:
        raise SpecError("dtype", cfg.dtype, f"must be one of {', '.join(TRAIN_DTYPES)}")
    if cfg.dtype == "fp8":
        check_fp8(cfg)
    elif cfg.fp8_all_gather:
        raise SpecError("fp8_all_gather", True, f"needs --dtype fp8, not {cfg.dtype}")
    if cfg.global_batch % cfg.dp:
        raise SpecError("global_batch", cfg.global_batch, f"must be a multiple of dp ({cfg.dp})")
    share = cfg.global_batch // cfg.dp
    if cfg.micro_batch and share % cfg.micro_batch:
        raise SpecError("micro_batch", cfg.micro_batch,
                        f"must divide each data-parallel rank's {share} sequences")
    if cfg.loss_parallel and cfg.tp == 1:
        raise SpecError("loss_parallel", True, "needs tp > 1 (it keeps the logits sharded "
                        "over the tensor-parallel ranks' vocabulary)")
    if cfg.shape.tied and cfg.pp > 1 and cfg.tp > 1:
        raise SpecError("tp", cfg.tp, "with a tied head split over pipeline stages is not "
                        "supported yet; untie the head (llama style) or use tp=1")
    if cfg.pp > 1:  # torch.distributed.pipelining's own limits, checked before any rank
        m, stages = cfg.microbatches, cfg.pp * cfg.virtual_stages
        if cfg.schedule == "1f1b" and m < cfg.pp:
            raise SpecError("micro_batch", cfg.micro_batch, f"gives {m} micro-batches; 1f1b "
                            f"needs at least pp={cfg.pp} (use a smaller --micro-batch)")
        if cfg.schedule == "interleaved-1f1b" and m % cfg.pp:
            raise SpecError("micro_batch", cfg.micro_batch, f"gives {m} micro-batches; "
                            f"interleaved-1f1b needs a multiple of pp={cfg.pp}")
        if cfg.schedule != "interleaved-1f1b" and stages != cfg.pp:
            raise SpecError("schedule", cfg.schedule, "runs one stage per rank; use "
                            "interleaved-1f1b with --virtual-stages > 1")
        if cfg.schedule == "interleaved-1f1b" and stages == cfg.pp:
            raise SpecError("virtual_stages", cfg.virtual_stages,
                            "must be >= 2 for interleaved-1f1b")
    if cfg.dp_mode == "ddp" and cfg.dp > 1 and cfg.pp > 1:
        raise SpecError("dp_mode", "ddp", "cannot run inside a pipeline (the schedule cannot "
                        "defer composable DDP's all-reduce to the last micro-batch, as "
                        "torchtitan refuses DDP with more than one mesh dim); use fsdp")
    if cfg.dp_mode == "ddp" and cfg.tp > 1:
        raise SpecError("dp_mode", "ddp", "cannot hold tensor-parallel (DTensor) parameters; "
                        "use fsdp with tp > 1")
    for name, value in (("steps", cfg.steps), ("seq", cfg.seq)):
        if value < 1:
            raise SpecError(name, value, "must be a positive integer")
    if cfg.fail_how not in FAIL_HOW:
        raise SpecError("fail_how", cfg.fail_how, f"must be one of {', '.join(FAIL_HOW)}")
    if cfg.fail_how == "kill-in-save" and (cfg.async_save or not cfg.checkpoint_dir):
        raise SpecError("fail_how", cfg.fail_how, "needs a synchronous --checkpoint-dir")
    if cfg.dp_replicate > 1 and cfg.dp_mode == "ddp":
        raise SpecError("dp_replicate", cfg.dp_replicate, "needs FSDP (HSDP replicates FSDP's "
                        "shards); use --dp-mode fsdp")
    make_layout(cfg.shape, dp=cfg.dp, tp=cfg.tp, pp=cfg.pp, virtual_stages=cfg.virtual_stages,
                sp=cfg.sp, micro_batch=cfg.micro_batch or share, global_batch=cfg.global_batch,
                seq=cfg.seq, recompute=layout_recompute(cfg.recompute), zero=cfg.zero,
                dtype=estimate_dtype(cfg),
                schedule=cfg.schedule if cfg.pp > 1 else None, ep=cfg.ep, etp=cfg.etp,
                capacity_factor=cfg.capacity_factor, cp=cfg.cp,
                stage_layers=cfg.stage_layers, dp_replicate=cfg.dp_replicate)


def layout_recompute(recompute: str) -> str:
    """The :class:`~shardlab.config.layout.Layout` name of a run's recompute: per-operator
    checkpointing (``op``) is what the planner calls ``selective`` under
    ``--framework torchtitan``; the others are their own."""
    return "selective" if recompute == "op" else recompute


def bf16_compute(cfg: TrainConfig) -> bool:
    """Whether the run computes in bf16: ``bf16``, and ``fp8`` outside its fp8 matmuls."""
    return cfg.dtype in ("bf16", "fp8")


def loss_split(cfg: TrainConfig) -> bool:
    """Whether the loss runs vocabulary-parallel (``--loss-parallel``: the logits stay split
    over tp): not in a pipeline, whose last stage takes the loss on gathered logits, and
    not without tensor parallelism (refused there)."""
    return cfg.tp > 1 and cfg.loss_parallel and cfg.pp == 1


def fsdp_mixed_precision(cfg: TrainConfig) -> bool:
    """Whether bf16 runs through FSDP2's MixedPrecisionPolicy (bf16 parameter copies,
    fp32 reduction) rather than autocast: bf16 with FSDP (over dp x cp > 1 ranks, not DDP)."""
    return bf16_compute(cfg) and cfg.grad_ranks > 1 and cfg.dp_mode != "ddp"


def under_autocast(cfg: TrainConfig) -> bool:
    """Whether bf16 runs under autocast (no FSDP mixed precision: one data-parallel rank, or
    DDP): the parameters stay fp32, so the norms' and the embedding's outputs and the
    residual stream are fp32 beside the matmuls' bf16 outputs."""
    return bf16_compute(cfg) and not fsdp_mixed_precision(cfg)


def estimate_dtype(cfg: TrainConfig) -> str:
    """The cost model's dtype policy for the run's states, activations and communication:
    ``amp-bf16`` (fp32 parameters, gradients and AdamW, bf16 compute) for bf16 and fp8 (an
    fp8 run keeps the bf16 run's states; its fp8 gathers, with ``fp8_all_gather``, are
    priced apart: :func:`shardlab.train.report_cp.fp8_gathered`), else ``fp32``."""
    return "amp-bf16" if bf16_compute(cfg) else "fp32"


def torchao_missing() -> str | None:
    """The line that says torchao is not installed (fp8 needs it), or None. Asks the import
    system only: no torch is loaded, so the command line can ask before anything starts."""
    if importlib.util.find_spec("torchao") is None:
        return ("needs torchao (pip install -c constraints.txt -e '.[torch]' installs the "
                "tested release)")
    return None


def require_torchao(cfg: TrainConfig) -> None:
    """SpecError for an fp8 run where torchao is not installed (the dry run runs the fp8
    program here: ``dryrun``, ``plan --dry-run-top``)."""
    if cfg.dtype == "fp8" and (missing := torchao_missing()) is not None:
        raise SpecError("dtype", "fp8", missing)


def check_fp8(cfg: TrainConfig) -> None:
    """What ``--dtype fp8`` needs of the run (the machine is checked apart: the CLI's
    :func:`shardlab.train.fp8.fp8_refusal`): a width that fp8's matmul takes (d_model a
    multiple of 16: every block linear has it on one side); and for ``fp8_all_gather``
    FSDP over more than one rank (with experts, a MoE block gathers its attention's and
    shared experts' fp8 weights in fp8, its routed experts' bf16). With tp > 1 the fp8
    linears take torchao's float8 tensor-parallel styles (a MoE block's: its shared experts'), whose
    bytes the report counts (:func:`shardlab.estimate.comm_dtensor.fp8_block_bytes`)."""
    if cfg.shape.d_model % 16:
        raise SpecError("d_model", cfg.shape.d_model, "must be a multiple of 16 with --dtype "
                        "fp8 (torch._scaled_mm's dimensions); no linear would run in fp8")
    if cfg.fp8_all_gather and (cfg.grad_ranks == 1 or cfg.dp_mode == "ddp"):
        raise SpecError("fp8_all_gather", True, "needs FSDP over more than one rank "
                        "(--dp-mode fsdp or fsdp-zero2 with dp x cp > 1): it is FSDP's gather")


def check_moe(cfg: TrainConfig) -> None:
    """What the real runs of a mixture-of-experts model cannot do yet, as one-line
    SpecErrors (the layout's own expert checks follow in :func:`check_config`)."""
    for name, value in (("aux_coef", cfg.aux_coef), ("z_coef", cfg.z_coef)):
        if not 0 <= value < math.inf:
            raise SpecError(name, value, "must be a finite number >= 0")
    if cfg.routing not in MOE_ROUTINGS:
        raise SpecError("routing", cfg.routing, f"must be one of {', '.join(MOE_ROUTINGS)}")
    if cfg.shape.moe is None:
        if cfg.etp != 1:
            raise SpecError("etp", cfg.etp, "needs a mixture-of-experts model")
        if cfg.routing != "learned":
            raise SpecError("routing", cfg.routing, "needs a mixture-of-experts model")
        return  # make_layout refuses ep > 1 or a capacity factor for a dense model
    if cfg.ep > 1 and cfg.dp_replicate > 1 and (cfg.dp // cfg.dp_replicate) % cfg.ep:
        raise SpecError("ep", cfg.ep, f"must divide dp/dp_replicate "
                        f"({cfg.dp // cfg.dp_replicate}): an expert-parallel group lies "
                        "inside one HSDP replica")
    if cfg.ep > 1 and cfg.dp_mode == "ddp":
        raise SpecError("dp_mode", "ddp", "cannot hold expert-parallel experts (DDP would "
                        "average different experts over dp); use fsdp with --ep")
    if cfg.sp:
        raise SpecError("sp", 1, "is not built for mixture-of-experts models (the MoE "
                        "layer routes whole sequences); leave out --sp")
    shared = cfg.shape.moe.shared_experts * cfg.shape.moe.shared_d_ff
    if shared % cfg.tp:
        raise SpecError("tp", cfg.tp, f"must divide the shared experts' width ({shared}): "
                        "they split over tp as the dense MLP does")
