"""Pipeline parallelism for TransformerLM with ``torch.distributed.pipelining``.

A model of ``L`` blocks is cut into ``pp · v`` stages (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM": ``pp`` pipeline
ranks, ``v`` model chunks per rank). :func:`split_model` builds the stages one rank owns
as :class:`StageModule` objects that keep the full model's parameter names (FQNs), as
torchtitan's ``pipeline_module_split`` does (``torchtitan/distributed/pipeline_parallel.py``):
the first stage owns ``embed`` (and ``pos``), every stage owns its blocks in an
``nn.ModuleDict`` keyed by the original layer index (``blocks.3.attn.q_proj.weight`` on
whatever stage holds layer 3), and the last stage owns ``final_norm`` and ``lm_head``. A
state dict of a stage is therefore a slice of the full model's, and a checkpoint or an
optimizer keyed by name needs no renaming.

Placement (``shardlab.schedules.actions``): in a loop, stage ``s`` is on rank
``s mod pp`` (GPipe, 1F1B, interleaved 1F1B); in a V (``v = 2``), stage ``s`` is on rank
``s`` for ``s < pp``, else on ``2pp - 1 - s`` (ZB-V, Qi et al. 2024; DualPipeV, DeepSeek-V3
report 2024), so rank 0 holds the first and the last stage. Layers are split evenly; when
``L`` does not divide, the first stages take one more; or unevenly, by a layout's
``stage_layers`` (one count per stage: Megatron-LM's ``--pipeline-model-parallel-layout``,
torchtitan's ``first_stage_less_layers``; the first and last stages carry the embedding
and the head, so giving them fewer blocks evens the stages' work).

Between stages travel ``(hidden, pad_mask)``: every stage's attention needs the padding
mask, and ``PipelineStage`` only moves what a stage returns. With context parallelism
(:mod:`shardlab.distributed.context_parallel`) ``hidden`` holds the cp rank's s/cp tokens
and ``pad_mask`` is the whole sequence's over the gathered keys ([b, s]); every stage
knows its cp rank (:attr:`StageModule.context`), so it builds the positions itself. The
mask stays the batch's int64 0/1 tensor: an integer tensor never requires grad, so the
stage infers no gradient for it and sends none back (``PipelineStage`` gives received
buffers ``requires_grad = is_floating_point()`` and skips outputs that do not require
grad).

The loss (:func:`make_loss_fn`) is each micro-batch's *summed* token cross-entropy divided
by the number of real tokens in the whole batch, so the micro-batch losses add up to the
one-device token-mean loss and their gradients add up to its gradient: schedules are built
with ``scale_grads=False`` (torch's default divides the accumulated gradients by the number
of micro-batches, which is right only for a per-micro-batch *mean* loss of equal-sized
micro-batches).

Tied embeddings (gpt style): with more than one stage the last stage keeps its own copy
of the embedding as its head, whose gradient
:func:`shardlab.distributed.tied_embedding.sync_tied_grads` sums with the first stage's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.schedules import _PipelineSchedule

from shardlab.distributed.context_parallel import CpShard, key_positions, local_positions
from shardlab.errors import SpecError, require_positive_int
from shardlab.estimate.partition import chunk_layers
from shardlab.nn.data import Batch
from shardlab.nn.model import TransformerLM, attention_mask, rope_tables
from shardlab.schedules.actions import loop_placement, v_placement

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index
PLACEMENT_STYLES = ("loop", "v")
SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-v", "dualpipev")


# --- splitting -------------------------------------------------------------------------

def stage_placement(pp: int, virtual_stages: int = 1, style: str = "loop") -> list[int]:
    """The pipeline rank of each of the ``pp · virtual_stages`` stages (loop or V)."""
    require_positive_int("pp", pp)
    require_positive_int("virtual_stages", virtual_stages)
    if style not in PLACEMENT_STYLES:
        raise SpecError("style", style, f"must be one of {', '.join(PLACEMENT_STYLES)}")
    if style == "v":
        if virtual_stages != 2:
            raise SpecError("virtual_stages", virtual_stages,
                            "must be 2 for V placement (two chunks per rank, down and up)")
        return v_placement(pp)
    return loop_placement(pp, virtual_stages)


def layer_split(layers: int, stages: int, stage_layers: Sequence[int] = ()) -> list[range]:
    """Consecutive layer ranges of ``stages`` stages: ``stage_layers[s]`` layers for stage s
    when given (each >= 1, summing to ``layers``), else the even split, the first
    ``layers % stages`` one larger."""
    require_positive_int("layers", layers)
    require_positive_int("stages", stages)
    if layers < stages:
        raise SpecError("stages", stages, f"must be <= the model's layers ({layers}): "
                        "every stage needs at least one block")
    if stage_layers and (len(stage_layers) != stages or min(stage_layers) < 1
                         or sum(stage_layers) != layers):
        raise SpecError("stage_layers", "+".join(map(str, stage_layers)), f"must give "
                        f"{stages} counts >= 1 summing to the model's {layers} layers")
    counts = chunk_layers(layers, stages, 1, stage_layers)  # the cost model's own split
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


class StageModule(nn.Module):
    """One pipeline stage of a :class:`TransformerLM`, with the full model's parameter names.

    ``embed`` (and ``pos``, gpt style) only on the first stage, ``blocks`` an
    ``nn.ModuleDict`` keyed by the original layer indices, ``final_norm`` and ``lm_head``
    only on the last stage; modules a stage does not own are ``None`` (no parameters).
    The owned submodules are deep copies of the model's, made with one memo per stage, so
    a stage that is both first and last (``pp = 1``) keeps a tied head tied, while the
    last stage of a longer pipeline gets its own copy of the tied weight
    (:attr:`holds_tied_copy`; see :func:`~shardlab.distributed.tied_embedding.sync_tied_grads`).

    forward: first stage ``(input_ids, pad_mask) -> (hidden, pad_mask)``; middle stages
    ``(hidden, pad_mask) -> (hidden, pad_mask)``; last stage ``(hidden, pad_mask) ->
    logits`` (a one-stage pipeline: ``(input_ids, pad_mask) -> logits``). ``pad_mask`` is
    the batch's [b, s] 0/1 integer tensor, passed through unchanged.
    """

    def __init__(self, model: TransformerLM, stage_index: int, num_stages: int,
                 layer_ids: Sequence[int], stage_ranks: Sequence[int]) -> None:
        super().__init__()
        self.shape = model.shape
        self.stage_index, self.num_stages = stage_index, num_stages
        self.layer_ids = tuple(layer_ids)
        self.stage_ranks = tuple(stage_ranks)  # pipeline rank of every stage
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        memo: dict[int, Any] = {}  # one memo: a tie inside this stage survives the copy
        first, last = self.is_first, self.is_last
        self.embed = copy.deepcopy(model.embed, memo) if first else None
        self.pos = copy.deepcopy(model.pos, memo) if first and model.pos is not None else None
        self.blocks = nn.ModuleDict({str(i): copy.deepcopy(model.blocks[i], memo)
                                     for i in self.layer_ids})
        self.final_norm = copy.deepcopy(model.final_norm, memo) if last else None
        self.lm_head = copy.deepcopy(model.lm_head, memo) if last else None
        self.context = (1, 0)  # (cp, this rank's cp index): set with apply_cp's gather

    @property
    def holds_tied_copy(self) -> bool:
        """Whether this stage holds one of the two copies of a tied embedding/head weight."""
        return self.shape.tied and self.num_stages > 1 and (self.is_first or self.is_last)

    def tied_weight(self) -> nn.Parameter:
        """The copy of the tied weight this stage holds (``embed.weight`` or ``lm_head.weight``)."""
        if not self.holds_tied_copy:
            raise SpecError("stage", self.stage_index, "holds no copy of a tied weight")
        module = self.embed if self.is_first else self.lm_head
        assert module is not None
        return module.weight

    def forward(self, x: torch.Tensor,
                pad_mask: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """See the class docstring; the same arithmetic as :meth:`TransformerLM.forward`.
        With context parallelism (:attr:`context`) ``x`` holds this cp rank's tokens and
        ``pad_mask`` the whole sequence's keys in their gathered order."""
        seq = pad_mask.shape[1]  # the whole sequence: h may be a sequence-parallel shard
        cp, cp_rank = self.context
        positions = keys = None
        if cp > 1:
            positions = local_positions(seq, cp, cp_rank, pad_mask.device)
            keys = key_positions(seq, cp, pad_mask.device)
        if self.embed is not None:
            if self.pos is not None and seq > self.shape.context:
                raise SpecError("seq", seq, f"must be <= context ({self.shape.context})")
            h = self.embed(x)
            if self.pos is not None:
                where = torch.arange(seq, device=x.device) if positions is None else positions
                h = h + self.pos(where)
        else:
            h = x
        local = seq if positions is None else positions.shape[0]
        mask = attention_mask(pad_mask, local, h.device, positions, keys)
        rope = (None if self.shape.style == "gpt"
                else rope_tables(local, self.shape.head_dim, h.dtype, self.shape.rope_theta,
                                 positions=positions))
        for block in self.blocks.values():
            h = block(h, mask, rope)
        if self.lm_head is not None:
            assert self.final_norm is not None
            return self.lm_head(self.final_norm(h))
        return h, pad_mask


def split_model(model: TransformerLM, pp: int, virtual_stages: int = 1, style: str = "loop",
                *, rank: int | None = None, group: dist.ProcessGroup | None = None,
                stage_layers: Sequence[int] = ()) -> list[tuple[int, StageModule]]:
    """The stages pipeline rank ``rank`` owns, as ``(stage_index, StageModule)`` by index.

    ``pp · virtual_stages`` stages in ``style`` placement (``"loop"``: stage ``s`` on rank
    ``s mod pp``; ``"v"``: ``virtual_stages = 2``, rank ``r`` holds stages ``r`` and
    ``2pp - 1 - r``), with ``stage_layers[s]`` layers in stage s (default: the even split,
    :func:`layer_split`). ``rank`` defaults to this process's rank in ``group`` (the
    pipeline group; the default group when None). Every rank must split the same
    (same-seeded) model, so the stages' parameters equal the full model's.
    """
    require_positive_int("pp", pp)
    placement = stage_placement(pp, virtual_stages, style)
    if rank is None:
        if not dist.is_initialized():
            raise SpecError("rank", None, "must be given when no process group is initialized")
        rank = dist.get_rank(group)
        if dist.get_world_size(group) != pp:
            raise SpecError("pp", pp, f"must equal the pipeline group's size "
                            f"({dist.get_world_size(group)})")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < pp:
        raise SpecError("rank", rank, f"must be an integer in [0, {pp})")
    ranges = layer_split(model.shape.layers, len(placement), stage_layers)
    return [(s, StageModule(model, s, len(placement), ranges[s], placement))
            for s in range(len(placement)) if placement[s] == rank]


def stage_io_meta(module: StageModule, micro_batch: int, seq: int, *, tp: int = 1,
                  sp: bool = False, dtype: torch.dtype | None = None,
                  autocast_bf16: bool = False, cp: int = 1) -> tuple[tuple[torch.Tensor, ...],
                                                                     tuple[torch.Tensor, ...]]:
    """Meta tensors of what one micro-batch brings into and takes out of a stage, for
    ``PipelineStage(input_args=..., output_args=...)`` (static shapes: no run-time shape
    inference, which would exchange metadata with the neighbouring stages first).

    Inputs: the first stage ``(input_ids, pad_mask)``, int64 ``[b, s]``; any other
    ``(hidden, pad_mask)``. Outputs: ``(hidden, pad_mask)``, or the last stage's logits
    ``[b, s, vocab]``. ``hidden`` is ``[b, s / tp, d]`` under sequence parallelism (the
    blocks' outputs stay Shard(1) local chunks, see
    :mod:`shardlab.distributed.tensor_parallel`), else ``[b, s, d]``; its dtype is
    ``dtype`` (FSDP2's bf16 parameter copies) or the parameters' own (under autocast the
    residual stream stays fp32; the head's logits are bf16). With context parallelism
    (``cp``) the token ids, ``hidden`` and the logits hold a cp rank's s/cp tokens; the
    padding mask stays the whole sequence's (the keys').
    """
    weights = next(iter(module.parameters()))
    param = dtype or weights.dtype
    local = seq // cp
    rows = local // tp if sp and tp > 1 else local

    def meta(shape: tuple[int, ...], kind: torch.dtype, grad: bool = False) -> torch.Tensor:
        return torch.empty(shape, dtype=kind, device="meta").requires_grad_(grad)

    mask = meta((micro_batch, seq), torch.int64)
    hidden = meta((micro_batch, rows, module.shape.d_model), param, grad=True)
    inputs = (meta((micro_batch, local), torch.int64), mask) if module.is_first else (hidden,
                                                                                     mask)
    if module.is_last:
        logits = torch.bfloat16 if autocast_bf16 else param
        return inputs, (meta((micro_batch, local, module.shape.vocab), logits, grad=True),)
    return inputs, (meta(hidden.shape, param, grad=True), meta((micro_batch, seq),
                                                                 torch.int64))


# --- loss ------------------------------------------------------------------------------

def masked_targets(batch: Batch) -> torch.Tensor:
    """The batch's targets with ``IGNORE_INDEX`` (-100) where ``loss_mask`` is 0."""
    return batch.targets.masked_fill(batch.loss_mask == 0, IGNORE_INDEX)


def make_loss_fn(global_tokens: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``loss_fn(logits, targets)``: summed cross-entropy over real tokens / ``global_tokens``.

    ``targets`` come from :func:`masked_targets`; ``global_tokens`` is
    :func:`shardlab.nn.data.global_token_normalizer` of the whole (global) batch, so the
    micro-batch losses sum to the global token-mean loss (build schedules with
    ``scale_grads=False``, as :func:`build_schedule` does).
    """
    require_positive_int("global_tokens", global_tokens)

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=IGNORE_INDEX, reduction="sum") / global_tokens

    return loss_fn


# --- schedules -------------------------------------------------------------------------

def pipeline_stages(owned: Sequence[tuple[int, StageModule]], device: torch.device | str,
                    group: dist.ProcessGroup | None = None) -> list[PipelineStage]:
    """Wrap :func:`split_model`'s stages in ``PipelineStage`` (shapes inferred at run time)."""
    return [PipelineStage(module, stage_index=s, num_stages=module.num_stages,
                          device=torch.device(device), group=group) for s, module in owned]


def build_schedule(name: str, stages: Sequence[PipelineStage], n_microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   ) -> _PipelineSchedule:
    """The ``torch.distributed.pipelining`` schedule ``name`` over this rank's stages.

    ``gpipe`` (ScheduleGPipe) and ``1f1b`` (Schedule1F1B) take one stage per rank in loop
    placement (1F1B needs ``n_microbatches >= pp``); ``interleaved-1f1b``
    (ScheduleInterleaved1F1B) at least two stages per rank in loop placement and
    ``n_microbatches`` a multiple of ``pp`` (Narayanan et al. 2021; torch 2.13 itself
    accepts more); ``zb-v`` (ScheduleZBVZeroBubble) and ``dualpipev`` (ScheduleDualPipeV)
    two stages per rank in V placement (DualPipeV needs ``n_microbatches >= 2pp``).
    Always ``scale_grads=False``: :func:`make_loss_fn` already divides by the global
    token count. Raises SpecError for an unknown name or a precondition that fails.
    """
    if name not in SCHEDULE_NAMES:
        raise SpecError("schedule", name, f"must be one of {', '.join(SCHEDULE_NAMES)}")
    require_positive_int("n_microbatches", n_microbatches)
    if not stages:
        raise SpecError("stages", 0, "need at least one stage on this rank")
    stages = list(stages)
    pp, rank, total = stages[0].group_size, stages[0].group_rank, stages[0].num_stages
    local = len(stages)
    v_style = name in ("zb-v", "dualpipev")
    if v_style:
        placement = v_placement(pp) if total == 2 * pp else []
    else:
        placement = [s % pp for s in range(total)]
    expected = [s for s, r in enumerate(placement) if r == rank]
    if sorted(s.stage_index for s in stages) != expected:
        raise SpecError("stages", [s.stage_index for s in stages],
                        f"must be rank {rank}'s stages of {total} in "
                        f"{'V' if v_style else 'loop'} placement on {pp} ranks"
                        + (" (two per rank)" if v_style else ""))
    common: dict[str, Any] = {"n_microbatches": n_microbatches, "loss_fn": loss_fn,
                              "scale_grads": False}
    if name in ("gpipe", "1f1b"):
        if local != 1:
            raise SpecError("schedule", name, f"runs one stage per rank, got {local} "
                            "(use interleaved-1f1b for virtual stages)")
        if name == "1f1b" and n_microbatches < pp:
            raise SpecError("n_microbatches", n_microbatches,
                            f"must be >= the number of stages ({pp}) for 1f1b")
        cls = ScheduleGPipe if name == "gpipe" else Schedule1F1B
        return cls(stages[0], **common)
    if name == "interleaved-1f1b":
        if local < 2:
            raise SpecError("schedule", name, "needs at least two stages per rank "
                            "(virtual_stages >= 2)")
        if n_microbatches % pp:
            raise SpecError("n_microbatches", n_microbatches,
                            f"must be a multiple of pp ({pp}) for interleaved-1f1b")
        return ScheduleInterleaved1F1B(stages, **common)
    if name == "dualpipev" and n_microbatches < total:
        raise SpecError("n_microbatches", n_microbatches,
                        f"must be >= the number of stages ({total}) for dualpipev")
    cls_v = ScheduleZBVZeroBubble if name == "zb-v" else ScheduleDualPipeV
    return cls_v(stages, **common)


def pipeline_step(schedule: _PipelineSchedule, batch_share: Batch | CpShard, is_first: bool,
                  is_last: bool) -> torch.Tensor | None:
    """One training step (forward and backward of every micro-batch) of ``schedule``.

    The rank holding the first stage feeds ``input_ids`` and ``pad_mask`` (the schedule
    splits them into micro-batches along dim 0); the rank holding the last stage gives
    :func:`masked_targets` and collects the micro-batch losses. ``batch_share`` (this
    pipeline's share of the global batch) must already be on the stages' device; with
    context parallelism it is this cp rank's :class:`CpShard` of it (its tokens, and the
    padding mask of every key).
    Returns the summed micro-batch loss (a detached 0-dim tensor, never read here, so a
    dry run on fake tensors passes) on the last stage's rank, None elsewhere.
    Gradients accumulate into the stages' parameters; with a tied head, call
    :func:`~shardlab.distributed.tied_embedding.sync_tied_grads` next.
    """
    if isinstance(batch_share, CpShard):
        tokens, pad = batch_share.batch, batch_share.key_pad
    else:
        tokens, pad = batch_share, batch_share.pad_mask
    args = (tokens.input_ids, pad) if is_first else ()
    losses: list[torch.Tensor] = []
    kwargs: dict[str, Any] = ({"target": masked_targets(tokens), "losses": losses}
                              if is_last else {})
    schedule.step(*args, return_outputs=False, **kwargs)
    if not is_last:
        return None
    return torch.stack([loss.detach() for loss in losses]).sum()
