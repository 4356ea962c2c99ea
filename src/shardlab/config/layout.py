"""Layout: how one training job is split over devices, validated against a model.

dp x tp x pp devices; ``virtual_stages`` model chunks per pipeline rank
(interleaved schedules); ZeRO stage 0-3 over dp (3 is FSDP); sequence parallel
across tp; micro-batch and global batch in sequences; sequence length in tokens;
activation recompute; dtype policy; pipeline schedule.

Mixture-of-experts layouts add expert parallelism: ``ep`` ranks drawn from the dp
group each hold experts/ep of every MoE layer's routed experts, and tokens reach
their experts by all-to-all (GShard, Lepikhin et al. 2020; torchtitan and
Megatron-LM borrow the ep group from dp the same way). ``etp`` is the expert
tensor-parallel degree: 1 keeps each expert whole on every tensor-parallel rank,
``tp`` splits each expert's width as the dense MLP is split (Megatron-LM's
``--expert-tensor-parallel-size``, whose default is tp). ``capacity_factor`` > 0
caps each expert at ceil(capacity_factor * tokens * top_k / experts) tokens per
micro-batch and drops the rest (Switch Transformer, Fedus et al. 2021); 0 is
dropless.

Context parallelism (``cp``) splits every sequence over cp ranks of their own mesh
dimension (devices = dp x cp x tp x pp), each holding chunks i and 2cp-1-i of the 2cp
chunks so the causal mask's work is balanced (Llama 3, Dubey et al. 2024, Sec. 3.3.2;
torchtitan). Uneven pipeline stages: ``stage_layers`` gives the layers of each of the
pp x virtual_stages model chunks, in order (Megatron-LM's
``--pipeline-model-parallel-layout``, torchtitan's ``first_stage_less_layers``); empty
is the even split. HSDP: ``dp_replicate`` replicas of ``dp / dp_replicate`` shards each
(FSDP2 on a 2-D mesh; ZeRO shards over the ``dp_shard`` ranks of a replica).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from shardlab.config.dtypes import DtypePolicy, get_policy
from shardlab.config.limits import MAX_BATCH, MAX_CONTEXT, MAX_GPUS, MAX_LAYERS
from shardlab.config.model import ModelShape
from shardlab.errors import SpecError, require_int_at_most, require_positive_int

RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v",
                              "dualpipev")
# Schedules that place two model chunks on each rank in a V shape.
V_SCHEDULES: tuple[str, ...] = ("zb-v", "dualpipev")


@dataclass(frozen=True)
class Layout:
    """A validated parallel layout. Build it with :func:`make_layout`."""

    dp: int
    tp: int
    pp: int
    virtual_stages: int
    zero: int
    sp: bool
    micro_batch: int
    global_batch: int
    seq: int
    recompute: str
    dtype: DtypePolicy
    schedule: str
    ep: int = 1
    etp: int = 1
    capacity_factor: float = 0.0
    cp: int = 1
    stage_layers: tuple[int, ...] = ()
    dp_replicate: int = 1
    expert_fold: bool = False
    """The expert layers take their own mesh over the stage's tp x cp x dp ranks (Megatron-
    Core's parallel folding, torchtitan's sparse mesh): ep divides tp·cp·dp/etp and each
    expert is replicated over tp·cp·dp/(ep·etp) ranks (:attr:`expert_replicas`)."""

    @property
    def dp_shard(self) -> int:
        """Ranks ZeRO/FSDP shards over inside one replica: dp / dp_replicate."""
        return self.dp // self.dp_replicate

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert per cp rank: dp / ep (ZeRO shards expert state over
        these x cp); with :attr:`expert_fold`, :attr:`expert_replicas` / cp rounded down."""
        return max(self.expert_replicas // self.cp, 1) if self.expert_fold else self.dp // self.ep

    @property
    def expert_replicas(self) -> int:
        """Ranks of a stage holding the same expert shard: dp/ep x cp, or with
        :attr:`expert_fold` tp·cp·dp/(ep·etp)."""
        if self.expert_fold:
            return self.dp * self.cp * (self.tp // self.etp) // self.ep
        return self.dp // self.ep * self.cp

    @property
    def gpus(self) -> int:
        """Devices in the job: dp * cp * tp * pp."""
        return self.dp * self.cp * self.tp * self.pp

    @property
    def microbatches(self) -> int:
        """Micro-batches per step on each data-parallel replica: global / (dp * micro_batch)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step: global_batch * seq."""
        return self.global_batch * self.seq

    def describe(self) -> str:
        """One line, in the form `--layout` reads later: ``dp=16 tp=8 pp=8 ...``."""
        return (f"dp={self.dp} tp={self.tp} pp={self.pp} virtual={self.virtual_stages} "
                f"zero={self.zero} sp={int(self.sp)} micro_batch={self.micro_batch} "
                f"global_batch={self.global_batch} seq={self.seq} recompute={self.recompute} "
                f"dtype={self.dtype.name} schedule={self.schedule}{self.describe_moe()}"
                f"{self.describe_new()}")

    def describe_new(self) -> str:
        """The context-parallel, uneven-stage and HSDP keys, only where set: ``""``, or
        `` cp=2 stage_layers=3+1 dp_replicate=2``."""
        out = f" cp={self.cp}" if self.cp > 1 else ""
        if self.stage_layers:
            out += " stage_layers=" + "+".join(map(str, self.stage_layers))
        return out + (f" dp_replicate={self.dp_replicate}" if self.dp_replicate > 1 else "")

    def describe_moe(self) -> str:
        """The expert-parallel keys, only where they differ from a dense layout's: ``""``,
        or `` ep=8 etp=1 capacity_factor=1.25``."""
        if self.ep == 1 and self.etp == self.tp and not self.capacity_factor:
            return ""
        cap = f" capacity_factor={self.capacity_factor:g}" if self.capacity_factor else ""
        return f" ep={self.ep} etp={self.etp}{cap}"


def make_layout(model: ModelShape, *, gpus: int | None = None, dp: int | None = None,
                tp: int = 1, pp: int = 1, virtual_stages: int = 1, zero: int = 0,
                sp: bool = False, micro_batch: int = 1, global_batch: int | None = None,
                seq: int | None = None, recompute: str = "none", dtype: str = "bf16",
                schedule: str | None = None, ep: int = 1, etp: int | None = None,
                capacity_factor: float = 0.0, cp: int = 1,
                stage_layers: tuple[int, ...] | list[int] | None = None,
                dp_replicate: int = 1, expert_fold: bool = False) -> Layout:
    """Resolve defaults and check every constraint; raise SpecError naming the bad field.

    ``dp`` defaults to gpus / (tp * pp) (or 1 without ``gpus``); ``global_batch`` to
    dp * micro_batch * pp (pp micro-batches per replica, enough to fill a 1F1B
    pipeline); ``seq`` to the model's context; ``schedule`` to 1f1b, or
    interleaved-1f1b when virtual_stages > 1. Each count is bounded
    (:mod:`shardlab.config.limits`): gpus, dp, tp, pp <= 2^20, virtual_stages <= 4,096,
    micro_batch and global_batch <= 2^24 sequences, seq <= 2^24 tokens.
    ``ep`` must divide dp (with ``expert_fold``, tp·cp·dp/etp) and the routed experts;
    ``etp`` (default tp) is 1 or tp;
    ``capacity_factor`` is 0 (dropless) or a finite number > 0 (module docstring).
    ``cp`` must split ``seq`` into 2*cp equal chunks; ``stage_layers`` has pp*virtual_stages
    counts >= 1 summing to the layers; ``dp_replicate`` divides dp and needs ZeRO >= 1.
    """
    require_int_at_most("cp", require_positive_int("cp", cp), MAX_GPUS)
    for name, v in (("tp", tp), ("pp", pp), ("virtual_stages", virtual_stages),
                    ("micro_batch", micro_batch)):
        require_positive_int(name, v)
    for name, v, limit in (("tp", tp, MAX_GPUS), ("pp", pp, MAX_GPUS),
                           ("virtual_stages", virtual_stages, MAX_LAYERS),
                           ("micro_batch", micro_batch, MAX_BATCH)):
        require_int_at_most(name, v, limit)
    if gpus is not None:
        require_int_at_most("gpus", require_positive_int("gpus", gpus), MAX_GPUS)
        if dp is None:
            model_par = tp * pp * cp
            if gpus % model_par:
                what = f"tp*pp ({tp}*{pp}={tp * pp})" if cp == 1 else \
                    f"cp*tp*pp ({cp}*{tp}*{pp}={model_par})"
                raise SpecError("gpus", gpus, f"must be a multiple of {what}")
            dp = gpus // model_par
    dp = 1 if dp is None else require_int_at_most("dp", require_positive_int("dp", dp), MAX_GPUS)
    if gpus is not None and dp * cp * tp * pp != gpus:
        if cp == 1:
            raise SpecError("gpus", gpus, f"must equal dp*tp*pp ({dp}*{tp}*{pp}={dp * tp * pp})")
        raise SpecError("gpus", gpus, f"must equal dp*cp*tp*pp ({dp}*{cp}*{tp}*{pp}="
                        f"{dp * cp * tp * pp})")
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise SpecError("zero", zero, "must be 0, 1, 2 or 3 (3 is FSDP)")
    if recompute not in RECOMPUTE:
        raise SpecError("recompute", recompute, f"must be one of {', '.join(RECOMPUTE)}")
    policy = get_policy(dtype)
    seq = (model.context if seq is None
           else require_int_at_most("seq", require_positive_int("seq", seq), MAX_CONTEXT))
    if model.style == "gpt" and seq > model.context:
        raise SpecError("seq", seq, f"must be <= the learned position table ({model.context}) "
                        "for a gpt-style model")
    global_batch = (dp * micro_batch * pp if global_batch is None
                    else require_positive_int("global_batch", global_batch))
    require_int_at_most("global_batch", global_batch, MAX_BATCH)
    if global_batch % (dp * micro_batch):
        raise SpecError("global_batch", global_batch,
                        f"must be a multiple of dp*micro_batch ({dp}*{micro_batch})")

    # Tensor parallel splits heads, kv heads and MLP width across ranks (Megatron-LM).
    for name, n in (("heads", model.heads), ("kv_heads", model.kv_heads), ("d_ff", model.d_ff)):
        if n % tp:
            raise SpecError("tp", tp, f"must divide {name} ({n})")
    if model.moe is not None and (etp is None or etp > 1) and model.moe.expert_d_ff % tp:
        raise SpecError("tp", tp, f"must divide moe.expert_d_ff ({model.moe.expert_d_ff})")
    if sp and tp == 1:
        raise SpecError("sp", int(sp), "sequence parallel needs tp > 1")
    if sp and seq % tp:
        raise SpecError("seq", seq, f"must be divisible by tp ({tp}) with sequence parallel")

    if schedule is None:
        schedule = "interleaved-1f1b" if virtual_stages > 1 else "1f1b"
    if schedule not in SCHEDULES:
        raise SpecError("schedule", schedule, f"must be one of {', '.join(SCHEDULES)}")
    chunks = pp * virtual_stages
    if chunks > model.layers:
        raise SpecError("pp", pp, f"pp*virtual_stages ({chunks}) must be <= layers "
                        f"({model.layers})")
    if schedule in V_SCHEDULES and virtual_stages != 2:
        raise SpecError("virtual_stages", virtual_stages, f"must be 2 for {schedule}")
    if schedule == "interleaved-1f1b":
        # Blame the number that is off, not the schedule the user asked for.
        if pp < 2:
            raise SpecError("pp", pp, "must be >= 2 for interleaved-1f1b")
        if virtual_stages < 2:
            raise SpecError("virtual_stages", virtual_stages,
                            "must be >= 2 for interleaved-1f1b")
    elif virtual_stages > 1 and schedule not in V_SCHEDULES:
        raise SpecError("virtual_stages", virtual_stages,
                        f"must be 1 for {schedule}; use interleaved-1f1b, zb-v or dualpipev")
    m = global_batch // (dp * micro_batch)
    if schedule == "interleaved-1f1b" and m % pp:
        # Megatron-LM's interleaved schedule runs micro-batches in groups of pp.
        raise SpecError("global_batch", global_batch,
                        f"gives {m} micro-batches per replica; interleaved-1f1b needs a "
                        f"multiple of pp ({pp})")
    if schedule == "dualpipev" and m < 2 * pp:
        # DualPipeV feeds micro-batches from both ends: at least 2 per stage (its generator's
        # precondition, checked here so the error names a flag of this command).
        raise SpecError("global_batch", global_batch,
                        f"gives {m} micro-batches per replica; dualpipev needs at least "
                        f"2*pp ({2 * pp})")
    etp = tp if etp is None else etp
    check_expert_layout(model, dp=dp, tp=tp, ep=ep, etp=etp, capacity_factor=capacity_factor,
                        cp=cp, fold=expert_fold)
    if cp > 1 and seq % (2 * cp):
        raise SpecError("cp", cp, f"must split seq ({seq}) into 2*cp={2 * cp} equal chunks "
                        "(each rank holds chunks i and 2cp-1-i)")
    if sp and cp > 1 and (seq // cp) % tp:
        raise SpecError("seq", seq, f"must be divisible by cp*tp ({cp}*{tp}) with sequence "
                        "parallel")
    stages = check_stage_layers(model, pp * virtual_stages, stage_layers)
    require_int_at_most("dp_replicate", require_positive_int("dp_replicate", dp_replicate),
                        MAX_GPUS)
    if dp % dp_replicate:
        raise SpecError("dp_replicate", dp_replicate, f"must divide dp ({dp}): dp = "
                        "dp_replicate replicas x dp/dp_replicate shards")
    if dp_replicate > 1 and zero == 0:
        raise SpecError("dp_replicate", dp_replicate, "needs zero >= 1 (HSDP replicates "
                        "shards: with zero=0 nothing is sharded)")
    return Layout(dp, tp, pp, virtual_stages, zero, sp, micro_batch, global_batch, seq,
                  recompute, policy, schedule, ep, etp, float(capacity_factor), cp, stages,
                  dp_replicate, expert_fold)


def parse_stage_layers(text: str | None) -> tuple[int, ...]:
    """Per-stage layer counts as written: ``3,1`` (a flag) or ``3+1`` (a layout key); ()
    when not given. SpecError naming stage_layers for anything but whole numbers below
    10^9 (:func:`make_layout` checks the counts against the model)."""
    if text is None:
        return ()
    parts = [p.strip() for p in str(text).replace("+", ",").split(",")]
    if not all(re.fullmatch(r"[0-9]{1,9}", p) for p in parts):
        raise SpecError("stage_layers", text, "must be whole layer counts, one per stage, "
                        "separated by , or + (e.g. 3,1)")
    return tuple(int(p) for p in parts)


def check_stage_layers(model: ModelShape, chunks: int,
                       stage_layers: tuple[int, ...] | list[int] | None) -> tuple[int, ...]:
    """``stage_layers`` as a tuple (empty for the even split), or SpecError naming
    stage_layers: one count per model chunk (pp x virtual_stages), each >= 1, summing to
    the model's layers."""
    if not stage_layers:
        return ()
    counts = tuple(stage_layers)
    for n in counts:
        if isinstance(n, bool) or not isinstance(n, int):
            raise SpecError("stage_layers", "+".join(map(str, counts)),
                            "must be whole layer counts")
    text = "+".join(map(str, counts))
    if len(counts) != chunks:
        raise SpecError("stage_layers", text, f"must give {chunks} counts (pp x "
                        f"virtual_stages model chunks), not {len(counts)}")
    if min(counts) < 1:
        raise SpecError("stage_layers", text, "must give every stage at least one layer")
    if sum(counts) != model.layers:
        raise SpecError("stage_layers", text, f"must sum to the model's {model.layers} "
                        f"layers, not {sum(counts)}")
    return counts


def check_expert_layout(model: ModelShape, *, dp: int, tp: int, ep: int, etp: int,
                        capacity_factor: float, cp: int = 1, fold: bool = False) -> None:
    """SpecError naming ep, etp or capacity_factor when the expert layout cannot be built:
    ep must divide dp (the ep group is drawn from the data-parallel ranks; with ``fold``,
    the expert mesh's tp·cp·dp/etp ranks) and the routed experts; etp is 1 or tp;
    capacity_factor is 0 (dropless) or a finite number > 0. A dense model takes only ep=1
    and no capacity factor."""
    require_int_at_most("ep", require_positive_int("ep", ep), MAX_GPUS)
    require_positive_int("etp", etp)
    if etp not in (1, tp):
        raise SpecError("etp", etp, f"must be 1 (whole experts) or tp ({tp})")
    if (isinstance(capacity_factor, bool) or not isinstance(capacity_factor, int | float)
            or not math.isfinite(capacity_factor) or capacity_factor < 0):
        raise SpecError("capacity_factor", capacity_factor,
                        "must be 0 (dropless) or a finite number > 0")
    if model.moe is None:
        if ep > 1:
            raise SpecError("ep", ep, f"needs a mixture-of-experts model ({model.name} is "
                            "dense)")
        if capacity_factor:
            raise SpecError("capacity_factor", capacity_factor,
                            f"needs a mixture-of-experts model ({model.name} is dense)")
        return
    if model.moe.experts % ep:
        raise SpecError("ep", ep, f"must divide moe.experts ({model.moe.experts})")
    if fold and (dp * cp * (tp // etp)) % ep:
        region = dp * cp * (tp // etp)
        raise SpecError("ep", ep, f"must divide tp*cp*dp/etp ({region}): the ranks of a "
                        "stage the framework's expert mesh folds")
    if not fold and dp % ep:
        raise SpecError("ep", ep, f"must divide dp ({dp}): the expert-parallel group is "
                        "drawn from the data-parallel ranks")
