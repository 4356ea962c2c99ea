"""What a training run's ranks keep for backward, as the cost model predicts it for
shardlab's eager LM: the cost model's per-layer figures
(:mod:`shardlab.estimate.activations`) and the tensors shardlab's own program keeps
beside them, each measured by the saved-tensor hooks of :mod:`shardlab.distributed.saved`
and named where it is added. Compared with the measured figure in a run's report
(:func:`shardlab.train.report.activation_table`) and the dry run's
(:mod:`shardlab.dryrun.compare`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from shardlab.estimate.activations import (
    first_stage_extra_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
    op_checkpoint_layer_bytes,
    sp_gathered_bytes,
)
from shardlab.estimate.comm_dtensor import scatters_at_blocks
from shardlab.estimate.context import cp_layer_activation_bytes
from shardlab.estimate.fp8 import prepared_inputs, row_parallel, tp_fp8_weights
from shardlab.estimate.params import norm_params
from shardlab.estimate.partition import layer_params_per_tp_rank, rank_layers
from shardlab.train.config import (
    bf16_compute,
    fsdp_mixed_precision,
    loss_split,
    under_autocast,
)
from shardlab.train.report_moe import router_extra_bytes, run_layout, stage_layer_ids


def predicted_activation_bytes(cfg: Any, pp_rank: int,
                               routed: dict[int, tuple[float, float]] | None = None) -> float:
    """Bytes pipeline rank ``pp_rank`` keeps for backward for one micro-batch, as the cost
    model predicts them for shardlab's eager LM (see :func:`activation_table`).
    ``routed``: per MoE layer, the rows the rank's router measured
    (:func:`~shardlab.train.report_moe.rank_rows`; balanced without). With context
    parallelism every per-token figure is of the rank's s/cp tokens and every attention
    one of its s/cp queries over all s keys
    (:func:`shardlab.estimate.context.cp_layer_activation_bytes`). Under per-operator
    checkpointing (``op``) a block keeps what
    :func:`~shardlab.estimate.activations.op_checkpoint_layer_bytes` counts: the cache of
    torch's selective checkpoint, measured with it (:mod:`shardlab.distributed.saved`)."""
    e, mb, seq = _dims(cfg)
    layers = rank_layers(cfg.shape.layers, cfg.pp, cfg.virtual_stages, cfg.stage_layers)
    p = pp_rank
    kw = {"tp": cfg.tp, "sp": cfg.sp}
    bs = mb * seq
    rc = cfg.recompute
    if cfg.shape.moe is None:
        per_layer = block_bytes(cfg, rc) + block_extra_bytes(cfg, rc, bs, e)
    else:  # dense and MoE layers differ: each of this rank's own
        first_moe = cfg.shape.dense_layers
        per_layer = sum(block_bytes(cfg, rc, i >= first_moe, (routed or {}).get(i))
                        + block_extra_bytes(cfg, rc, bs, e, i >= first_moe)
                        for i in stage_layer_ids(cfg, p)) / layers[p]
    # Beyond the cost model's tensors, shardlab's loop keeps the token ids (int64, embedding),
    # the targets (int64) and, without a pipeline, the fp32 token weights of the loss; and
    # checkpointed blocks keep the boolean [b, 1, s, s] mask they are called with. The ids
    # and the targets without a pipeline are views of the whole global batch (Batch.split),
    # whose storage the meter counts whole, 8·G·s each (until 2026-12-07 counted at the
    # micro-batch's 8·b·s: a one-layer pipeline stage under full recompute read 1.08); a
    # context-parallel rank takes its columns by indexing, a copy of its b·s/cp alone.
    ids = 8 * (cfg.global_batch * cfg.seq if cfg.cp == 1 else bs)
    targets = (ids + 4 * bs) if cfg.pp == 1 else 8 * bs
    # (per-operator checkpointing keeps the block's inputs as full recompute does).
    whole = cfg.recompute in ("full", "op")
    mask = bs * cfg.seq if whole else 0
    # With sequence parallelism torch's column-parallel head keeps the input it gathered over
    # the sequence, whole (the cost model counts Megatron's 1/t shard); a tied model's
    # replicated final norm and head each keep theirs whole (the sequence gathered at the
    # norm). Where the sequence is scattered at blocks.0 (tied or learned positions), a
    # checkpointed first block keeps its input as it came, whole. The norm's input and the
    # block's are the residual stream's, fp32 under autocast; the head's a bf16 copy.
    shard_gap = bs * cfg.shape.d_model * (1 - 1 / cfg.tp) if cfg.sp else 0.0
    residual = 4 if under_autocast(cfg) else e
    head = shard_gap * (e + (residual if cfg.shape.tied else 0))
    first = shard_gap * residual if whole and scatters_at_blocks(cfg.shape) else 0.0
    # Without loss parallelism the head's output is gathered over the vocabulary: each
    # tensor-parallel rank keeps the whole [b, s, V] of what the loss saves (its fp32
    # log-softmax: 16-bit logits are upcast first, nn/loss.py), where the cost model
    # counts 1/t of them in fp32.
    sharded = loss_split(cfg)
    logits = bs * cfg.shape.vocab * (4 / (cfg.tp if sharded else 1) - 4 / cfg.tp)
    # The final norm keeps what a block's norm keeps (block_extra_bytes): it is outside the
    # blocks, so no checkpoint runs it again, under full recompute too (until 2026-12-07
    # left out there: the dry run's saved bytes read 1.26 of the count at d=128).
    norm = norm_extra_bytes(cfg, bs, e)
    return (layers[p] * per_layer + mask + (ids + first) * (p == 0)
            + autocast_cast_bytes(cfg, p)
            + (targets + head + logits + norm) * (p == cfg.pp - 1)
            + (first_stage_extra_bytes(cfg.shape, mb, seq, dropout=False, **kw)
               if p == 0 else 0.0)
            + (last_stage_extra_bytes(cfg.shape, mb, seq, e, **kw)
               if p == cfg.pp - 1 else 0.0))


def autocast_cast_bytes(cfg: Any, pp_rank: int) -> float:
    """The bf16 copies of the rank's linear weights that a bf16 run through autocast (no
    FSDP: one rank, tensor or pipeline parallelism alone, DDP) saves for backward: autocast
    casts each fp32 weight once and caches the copy, and the linear saves it; 2 B a weight
    (and bias) element of every block's linears and of the head, on the ranks that hold
    them, but not of a block whose forward runs again in backward (full recompute, or
    per-operator checkpointing, which casts again). FSDP's bf16 parameters replace autocast
    and are not activations; fp8 is not counted. A MoE layer's are its attention's, its
    shared experts', its router's and its routed experts' as the rank holds them (each
    expert's slice is cast in the grouped loop; counted since 2026-12-07: `train --tp 2
    --experts 4 --top-k 2 --dtype bf16` read 1.34 of the count without them, 1.04 with
    them and each linear's input copy, :func:`autocast_input_bytes`).

    Measured by the dry run (``shardlab dryrun --layers 2 --d-model 256 --heads 4 --d-ff
    512 --vocab 512 --seq 128 --dtype bf16``, 2026-12-07): with ``dp=1`` the saved bytes
    exceed the count without this term by the rank's 1,441,792 linear elements x 2 B and
    68 KB more; the same over ``dp=2`` (FSDP's bf16 parameters) by none of it. Each
    micro-batch's forward saves the cached copy again, so the saved-tensor meter counts it
    per micro-batch; in a pipeline the copies held at once are one, which the held
    activations (x the micro-batches in flight) over-count."""
    if cfg.dtype != "bf16" or fsdp_mixed_precision(cfg):
        return 0.0
    m = cfg.shape
    blocks = 0
    if cfg.recompute not in ("full", "op"):
        # A MoE layer's weights as the rank holds them: attention, shared experts, router
        # and its routed experts (each expert's slice cast in the grouped loop).
        lay = run_layout(cfg)
        first_moe = m.dense_layers if m.moe is not None else m.layers
        blocks = sum(layer_params_per_tp_rank(m, cfg.tp, i >= first_moe, lay.ep, lay.etp)
                     - 2 * norm_params(m) for i in stage_layer_ids(cfg, pp_rank))
    split = cfg.tp if cfg.tp > 1 and not m.tied else 1  # the vocabulary-parallel head
    head = m.vocab * m.d_model / split if pp_rank == cfg.pp - 1 else 0
    return 2.0 * (blocks + head)


def _dims(cfg: Any) -> tuple[int, int, int]:
    """(activation bytes, micro-batch, this rank's tokens of every sequence: s/cp)."""
    return (2 if bf16_compute(cfg) else 4, cfg.micro_batch or cfg.global_batch // cfg.dp,
            cfg.seq // cfg.cp)


def block_bytes(cfg: Any, recompute: str, moe_layer: bool = False,
                rows: tuple[float, float] | None = None) -> float:
    """The cost model's bytes one block of the run keeps for backward per micro-batch
    under ``recompute``: a MoE block (``moe_layer``, with the ``rows`` its router measured,
    else balanced) as its experts are laid out, per-operator checkpointing's cache
    (``op``), a context-parallel rank's s/cp queries over all s keys, else the dense
    block's figure (:mod:`shardlab.estimate.activations`)."""
    e, mb, seq = _dims(cfg)
    kw = {"tp": cfg.tp, "sp": cfg.sp}
    common = {"recompute": recompute, "dropout": False, "flash": True, "eager": True}
    if cfg.shape.moe is not None:
        lay = run_layout(cfg)
        # In one process (ep = 1) the experts read a view of the permuted T·k rows, the
        # assignments capacity dropped included, so that storage is kept whole; over ep
        # ranks the all-to-all's output holds the rows taken alone.
        view = (rows[1] - rows[0]) * cfg.shape.d_model * e if (
            rows is not None and moe_layer and lay.ep == 1
            and recompute in ("none", "selective")) else 0.0
        if cfg.cp > 1:  # the rank's s/cp tokens, its queries over all s keys
            lay = run_layout(dataclasses.replace(cfg, recompute=recompute))
            return view + cp_layer_activation_bytes(cfg.shape, lay, dropout=False, flash=True,
                                                    eager=True, moe_layer=moe_layer, rows=rows)
        return view + layer_activation_bytes(cfg.shape, mb, cfg.seq, e, moe_layer=moe_layer,
                                             rows=rows, ep=lay.ep, etp=lay.etp,
                                             capacity_factor=lay.capacity_factor,
                                             **common, **kw)
    if recompute == "op":  # the block's input and the outputs the policy saves
        return op_checkpoint_layer_bytes(cfg.shape, mb, seq, e, **kw)
    if cfg.cp == 1:
        return layer_activation_bytes(cfg.shape, mb, seq, e, **common, **kw)
    lay = run_layout(dataclasses.replace(cfg, recompute=recompute))
    return cp_layer_activation_bytes(cfg.shape, lay, dropout=False, flash=True, eager=True)


def norm_extra_bytes(cfg: Any, tokens: int, e: int) -> float:
    """What one norm over ``tokens`` (b·s; its 1/t under sequence parallelism) keeps beyond
    the cost model's one input in the compute dtype (``e`` bytes): torch's nn.RMSNorm
    keeps two fp32 [b, s, d] tensors (its input upcast, and the normalised input before
    the weight); a gpt-style LayerNorm keeps its input, fp32 under autocast (the residual
    stream stays fp32: 1.07-1.13 of the count in gpt dry runs through autocast until
    2026-12-07), else in the compute dtype, as counted."""
    if cfg.shape.style != "llama":
        return residual_extra_bytes(cfg, tokens, e)
    return (8 - e) * tokens * cfg.shape.d_model / (cfg.tp if cfg.sp else 1)


def head_norm_extra_bytes(cfg: Any, recompute: str, tokens: int, e: int) -> float:
    """What Qwen3's query and key norms (``qk_norm``) of one block keep beyond the cost
    model's inputs at ``e`` bytes: torch's nn.RMSNorm keeps two fp32 tensors of its input's
    size (as :func:`norm_extra_bytes`), over the rank's (q + k)/t columns of ``tokens``
    rows; 0 where a checkpoint runs them again (full, per-operator)."""
    m = cfg.shape
    if not m.qk_norm or recompute not in ("none", "selective"):
        return 0.0
    return (8 - e) * tokens * (m.q_dim + m.kv_dim) / cfg.tp


def residual_extra_bytes(cfg: Any, tokens: int, e: int) -> float:
    """One residual-stream tensor over ``tokens`` (its 1/t under sequence parallelism) kept
    as it is, beyond the count's ``e`` bytes an element: fp32 under autocast (the adds and
    norms leave it fp32), so 4 - e; 0 elsewhere (it is in the compute dtype)."""
    if not under_autocast(cfg):
        return 0.0
    return (4 - e) * tokens * cfg.shape.d_model / (cfg.tp if cfg.sp else 1)


def block_extra_bytes(cfg: Any, recompute: str, tokens: int, e: int,
                      moe_layer: bool = False) -> float:
    """What a block of shardlab's program keeps beyond the cost model's per-layer figure
    under ``recompute``, for ``tokens`` (b·s) at ``e``-byte activations: with sequence
    parallelism torch keeps the q/k/v and MLP inputs it gathered, whole (two [b, s, d];
    Megatron keeps the 1/t shard and gathers it again in backward: the dry run of
    Llama-3-8B, docs/agree.md), unless the block is checkpointed; its two RMSNorms'
    fp32 tensors (:func:`norm_extra_bytes`), unless a checkpoint runs them again
    (full) or per-operator checkpointing keeps its own, and Qwen3's query/key norms'
    (:func:`head_norm_extra_bytes`); and without recompute torch's
    fused CPU attention's additive [b, 1, s, s] mask in the compute dtype, where the cost
    model counts fp32; in fp8 under tensor parallelism, less :func:`fp8_tp_input_bytes` (of
    a MoE block where ``moe_layer``); a MoE block's router and permutation tensors
    (:func:`~shardlab.train.report_moe.router_extra_bytes`). A checkpointed block (full,
    per-operator) keeps its input as it came: fp32 under autocast, whose residual stream
    stays fp32, where the count has ``e`` bytes (1.12-1.13 of the count under full
    recompute until 2026-12-07)."""
    whole = recompute in ("full", "op")
    gathered = sp_gathered_bytes(cfg.shape, tokens, cfg.tp, cfg.sp, e) if not whole else 0
    norms = 2 * norm_extra_bytes(cfg, tokens, e) if recompute in ("none", "selective") else 0
    mask = (e - 4) * tokens * cfg.seq if recompute == "none" else 0
    wide_input = residual_extra_bytes(cfg, tokens, e) if whole else 0.0
    router = router_extra_bytes(cfg, recompute, e) if moe_layer else 0.0
    return (gathered + norms + mask + wide_input + rope_table_bytes(cfg, recompute, e) + router
            + head_norm_extra_bytes(cfg, recompute, tokens, e)
            + autocast_input_bytes(cfg, recompute, tokens, e, moe_layer)
            - fp8_tp_input_bytes(cfg, recompute, tokens, e, moe_layer))


def autocast_input_bytes(cfg: Any, recompute: str, tokens: int, e: int,
                         moe_layer: bool = False) -> float:
    """Under autocast (bf16 without FSDP's mixed precision) the norms' outputs are fp32 and
    each linear casts its own input to bf16, keeping that copy (autocast caches weights'
    casts, not activations'): q, k and v three copies of the attention's input and gate
    and up two of the MLP's, where the count has one of each; in a MoE block (``moe_layer``)
    the router's copy is the one counted and the shared experts' gate and up add theirs
    (the routed experts' rows are counted at the compute dtype already). What that adds
    per block, T·h at ``e`` bytes a copy; 0 where the block's linear inputs are not kept
    (full recompute, per-operator checkpointing). Measured by the dry run's per-storage
    dump (2026-12-07, ``--gpus 2 --layout "dp=1 tp=2"``: eleven [T, h] bf16 inputs over 2
    blocks and the head)."""
    m = cfg.shape
    if (cfg.dtype != "bf16" or fsdp_mixed_precision(cfg)
            or recompute not in ("none", "selective")):
        return 0.0
    column_mlp = m.mlp_matrices - 1  # gate and up (llama), up (gpt)
    if moe_layer and m.moe is not None:
        mlp = column_mlp if m.moe.shared_experts else 0
    else:
        mlp = column_mlp - 1
    return (2 + mlp) * tokens * m.d_model * e  # + q, k, v's two beyond the one counted


def rope_table_bytes(cfg: Any, recompute: str, e: int) -> float:
    """The rotary cos and sin tables, [s/cp, head_dim] each, that one llama block keeps for
    backward (its products with q and k keep the tables, which need no gradient: not q and
    k) when FSDP's mixed precision casts the block's floating-point inputs, making each
    block its own ``e``-byte copies; 0 where the attention is recomputed (selective, full,
    per-operator) and where the tables are one fp32 pair shared by every block (no FSDP
    mixed precision: a few KB per stage, left out). Measured by the dry run's per-storage
    dump (2026-12-07): two [s, hd] bf16 tensors a block."""
    if cfg.shape.style != "llama" or recompute != "none" or not fsdp_mixed_precision(cfg):
        return 0.0
    return 2.0 * (cfg.seq // cfg.cp) * cfg.shape.head_dim * e


def fp8_tp_input_bytes(cfg: Any, recompute: str, tokens: int, e: int,
                       moe_layer: bool = False) -> float:
    """What a block of an fp8 run under tensor parallelism keeps for backward below the
    bf16 count (:func:`block_extra_bytes` subtracts it), for ``tokens`` (b·s): torchao's
    float8 tensor-parallel styles cast a linear's input before it is laid out, and its
    ``matmul_with_hp_or_float8_args`` saves the input it was handed, so the fp8 copy is what
    backward keeps, 1 byte an element:

    * in place of the bf16 tensor (``e`` bytes): the attention's and the MLP's inputs, each
      cast once where every linear reading it is fp8 (T·h, whole on each tp rank), and the
      MLP's down projection's input (T·f/t), which nothing else keeps;
    * beside a bf16 tensor kept anyway: the attention's output projection's input (T·q/t),
      the attention kernel's output, which the kernel keeps and the bf16 projection shares;
      in a MoE block (``moe_layer``) the shared experts' copy of the MLP input (T·h, cast
      once at ``mlp.shared``), whose bf16 the router keeps.

    The scales, 4 B a tensor, are left out. Measured with the dry run's saved-tensor meter
    (2026-12-07, ``--layers 1 --d-model 32 --gpus 4 --layout "dp=2 tp=2 micro_batch=4"
    --seq 32 --dtype fp8`` against ``bf16``: 14,320 B fewer, this count's 14,336 less the
    four tensors' scales). 0 without tp (each linear casts inside and saves its bf16
    input) and for a block whose linears' inputs are not kept (full recompute;
    per-operator checkpointing keeps matmul outputs)."""
    m = cfg.shape
    if cfg.dtype != "fp8" or cfg.tp == 1 or recompute not in ("none", "selective"):
        return 0.0
    weights = tp_fp8_weights(m, cfg.tp, moe_layer)
    attn, mlp = prepared_inputs(m, frozenset(weights))
    # Row-parallel inputs: the output projection's beside the kernel's output; the rest
    # (the dense or shared MLP's down projection) in place of their bf16 inputs.
    out_proj = weights.get("attn.o_proj", (0, 0))[1]
    down = sum(w for name, (_, w) in weights.items() if row_parallel(name)) - out_proj
    replaced = m.d_model * (attn + (0 if moe_layer else mlp)) + down
    beside = out_proj + (m.d_model * mlp if moe_layer else 0)
    return tokens * ((e - 1) * replaced - beside)


def recomputed_block_bytes(cfg: Any) -> float:
    """Under full recompute, what one block holds the moment its backward begins: its
    forward run again, keeping for backward all that a block without recompute keeps (the
    cost model's per-layer figure with ``recompute="none"`` and the tensors of shardlab's
    program beside it, as :func:`predicted_activation_bytes` counts them; a MoE model's
    MoE block, the larger). 0 for any other recompute mode, whose blocks keep their
    tensors from the forward."""
    if cfg.recompute != "full":
        return 0.0
    e, mb, seq = _dims(cfg)
    moe = cfg.shape.moe is not None
    return block_bytes(cfg, "none", moe_layer=True) + block_extra_bytes(cfg, "none",
                                                                        mb * seq, e, moe)
