"""Activation memory: the bytes forward keeps for backward, per layer and per pipeline stage.

Per layer, for micro-batch b, sequence s, hidden h, a heads, tensor-parallel t
(Korthikanti et al. 2022, arXiv 2205.05198, Sec. 4 and Table 2), with 16-bit
activations and 1-byte dropout masks:

=================================  ===========================
no parallelism                     sbh·(34 + 5as/h)
tensor parallel                    sbh·(10 + 24/t + 5as/(ht))
tensor + sequence parallel         sbh·(34/t + 5as/(ht))
tensor parallel + selective        sbh·(10 + 24/t)
tensor + sequence + selective      sbh·34/t
full recompute                     2·sbh (layer input; /t with sequence parallel)
=================================  ===========================

shardlab derives these term by term so that they hold for any shape and dtype:
e bytes per activation element, q = heads·head_dim, k = kv_heads·head_dim, f =
d_ff, and masks of 1 byte only when the model trains with dropout. Outside the
tensor-parallel region (divided by t only with sequence parallel): the inputs of
the two norms, of the QKV projection and of the MLP (4·e·sbh) and the two dropout
masks (2·sbh). Inside it (always divided by t): Q, K, V (e·sb(q + 2k)), the
output projection's input (e·sbq), the MLP's hidden activations (e·sb·2f for
GELU: fc1 output and fc2 input; e·sb·3f for SwiGLU: gate, up and down input), and
the attention core a·s²·b·(2e + 1): softmax output, dropout mask and dropout
output. Query/key norms (Qwen3, ``qk_norm``) keep their inputs, e·sb(q + k), inside the
region too. Selective recompute drops the attention core; full recompute keeps only
the layer input. With kv_heads = heads, f = 4h, e = 2 and dropout, this is exactly
Table 2 (checked in the tests).

fp8 with Transformer Engine (``input_bytes=1``): each linear layer keeps for backward
the fp8 copy of its input it multiplied, 1 byte per element, not the bf16 input (TE
``Linear``/``LayerNormLinear``/``GroupedLinear`` save ``inputmat``/``ln_out`` quantized,
v1.8 to v2.8: its transpose on Hopper, its data on Blackwell). So the QKV and MLP inputs
and the MLP's down-projection input take 1 byte; the norms' inputs, Q, K, V and the
gated MLP's gate and up outputs stay at e (the attention kernel and Megatron-Core's
fused SwiGLU save their own bf16 inputs), and the output projection keeps an fp8 copy of
the attention output beside the kernel's bf16 one (Megatron-Core core_v0.14.0
``attention.py``: "linear_proj also saves the quantized tensor of this output"; only
newer TE with a non-delayed recipe drops it). torchao's Float8Linear saves the bf16
input (``ctx.save_for_backward(input_hp, weight_hp_t)``), so torchtitan keeps e.

Latent attention (``mla``) saves Q, K (heads·qk_head_dim each), V and the attention
output (heads·v_head_dim each) inside the tensor-parallel region, and outside it, like
the norms' inputs (split by t only with sequence parallelism: its down projections run
on the local s/t tokens), each latent twice, its norm's input at e and the up
projection's input at the linear input's bytes, and the shared rotary key at e:
sb·(e·(q_lora + kv_lora + rope) + li·(q_lora + kv_lora)). An estimate from the
module's structure (DeepSeek-V3's ``modeling_deepseek.py``), not a measured count.

A fused attention kernel (``flash=True``: FlashAttention, Dao et al. 2022, and
torch's scaled_dot_product_attention) never stores the s x s matrices: it keeps
the softmax statistics, a·s·b fp32 values (4·a·s·b bytes, divided by t), and
regenerates dropout masks from the RNG state.

Mixture-of-experts layers keep the dense terms of attention, the norms and the
shared experts (split by tp like a dense MLP) and, instead of one MLP's hidden
activations, the routed part of :func:`shardlab.estimate.expert.routed_activation_bytes`:
the dispatched rows, the experts' hidden activations (divided by etp, not tp), the
combined outputs and the router's probabilities, for the tokens the rank's experts
actually take (capacity factor, routing imbalance).

Per-operator selective checkpointing (torchtitan's ``selective_ac_option = "op"``,
:func:`op_checkpoint_layer_bytes`) keeps far less than Korthikanti's selective: the
block's input (the non-reentrant checkpoint saves its inputs), the outputs of every
second linear matmul (q, v, gate and down in a SwiGLU block: its policy saves
``aten.mm`` outputs "except every second mm", counted per block), the attention
kernel's output with its fp32 log-sum-exp and, with sequence parallelism, the
reduce-scatters' outputs; everything else is run again in backward.

Beyond the layers (Korthikanti Sec. 4.3): the first stage keeps the embedding's
dropout mask, the last stage the final norm's and head's inputs and the fp32
logits for the cross-entropy (4·s·b·V/t bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.config.model import ModelShape
from shardlab.estimate.expert import routed_activation_bytes, routed_tokens


@dataclass(frozen=True)
class ActivationTerms:
    """Bytes of one layer's saved activations for one micro-batch, split by where they live."""

    outside_tp: float   # norms' and projections' inputs, dropout masks (split by sp)
    inside_tp: float    # Q, K, V, projections' inputs, MLP hidden (split by tp)
    attention_core: float  # a·s²·b terms (split by tp; dropped by selective recompute)
    layer_input: float  # what full recompute keeps
    mlp_hidden: float = 0.0  # of inside_tp: a dense MLP's (a MoE layer's shared experts') hidden
    up_proj: float = 0.0  # of inside_tp: latent attention's Q, K and V (up projections' outputs)


def activation_terms(m: ModelShape, micro_batch: int, seq: int, elem_bytes: int,
                     dropout: bool, moe_layer: bool = False, eager: bool = False,
                     input_bytes: int | None = None) -> ActivationTerms:
    """Term-by-term saved bytes of one layer, before any parallel split (see module doc).

    ``eager`` counts what PyTorch's autograd keeps for shardlab's own unfused LM, where
    kernels are not fused as in Megatron: SwiGLU keeps silu(gate) as well (4f, not 3f);
    with ``flash`` the CPU kernel also keeps an fp32 [b, 1, s, s] mask per layer
    (:func:`layer_activation_bytes`). Nothing else: the rotary embedding's products keep
    only the cos and sin tables (the tables need no gradient, so autograd keeps not q and
    k before rotation), and the attention kernel's output, laid out [b, s, heads, hd],
    is the output projection's input by a view, not a copy (a per-storage dump of the dry
    run's saved tensors, 2026-12-07; counting those three T·h copies put the eager count
    4-6% above the program's saved bytes at d=128: 0.941-0.959 measured over counted).
    A MoE layer's MLP terms here are its shared experts' only. ``input_bytes``: bytes of
    each linear layer's saved input (None: ``elem_bytes``; 1 for Transformer Engine's fp8,
    module docstring).
    """
    sb = seq * micro_batch
    mask = 1 if dropout else 0
    e, li = elem_bytes, elem_bytes if input_bytes is None else input_bytes
    # A MoE layer's routed part is expert.py's; here only its shared experts.
    moe = m.moe if moe_layer else None
    hidden = m.d_ff if moe is None else moe.shared_experts * moe.shared_d_ff
    # The MLP's hidden activations: the first matmul's output(s) at e, the down
    # projection's input at the linear input's bytes.
    mlp_hidden = ((1 if m.style == "gpt" else 3 if eager else 2) * e + li) * hidden
    # fp8 inputs: the output projection's own copy beside the attention kernel's output.
    proj_copy = li * m.o_dim if li != e else 0
    # A MoE layer's MLP input is the router's, a bf16 linear (the experts' fp8 copies are
    # the dispatched rows of the routed part).
    mlp_in = e if moe else li
    latents = 0
    if m.mla is not None:
        lora = m.mla.q_lora_rank + m.mla.kv_lora_rank
        latents = e * (lora + m.mla.qk_rope_head_dim) + li * lora
    # Qwen3's query/key norms keep their inputs, the projections' outputs, beside the
    # normed and rotated Q and K the attention keeps (Megatron-Core's q/k layernorms run
    # outside the checkpointed core attention).
    head_norms = e * (m.q_dim + m.kv_dim) if m.qk_norm else 0
    return ActivationTerms(
        outside_tp=sb * (m.d_model * (2 * e + li + mlp_in + 2 * mask) + latents),
        inside_tp=sb * (e * (m.q_dim + m.kv_dim + m.v_dim + m.o_dim) + mlp_hidden
                        + proj_copy + head_norms),
        mlp_hidden=sb * mlp_hidden,
        up_proj=sb * e * (m.q_dim + m.kv_dim + m.v_dim) if m.mla is not None else 0.0,
        attention_core=m.heads * seq * sb * (2 * e + mask),
        layer_input=sb * m.d_model * e,
    )


def layer_activation_bytes(m: ModelShape, micro_batch: int, seq: int, elem_bytes: int = 2, *,
                           tp: int = 1, sp: bool = False, recompute: str = "none",
                           dropout: bool = True, moe_layer: bool = False,
                           flash: bool = False, eager: bool = False, ep: int = 1,
                           etp: int | None = None, capacity_factor: float = 0.0,
                           imbalance: float = 1.0, input_bytes: int | None = None,
                           modules: tuple[str, ...] = (),
                           combine_bytes: int | None = None,
                           rows: tuple[float, float] | None = None) -> float:
    """Bytes one layer saves for backward, per micro-batch, on one tensor-parallel rank.

    ``modules``: under selective recompute, Megatron-Core's ``--recompute-modules``
    (:data:`RECOMPUTE_MODULES`) instead of Korthikanti's attention core alone.

    A MoE layer adds its routed part with expert parallel ``ep``, expert tensor parallel
    ``etp`` (default tp), ``capacity_factor`` and routing ``imbalance`` (max/mean expert
    load) (:func:`shardlab.estimate.expert.routed_activation_bytes`, whose ``rows`` a
    measured rank's routing gives); ``input_bytes``: a linear layer's saved input
    (:func:`activation_terms`).
    """
    t = activation_terms(m, micro_batch, seq, elem_bytes, dropout, moe_layer, eager,
                         input_bytes)
    if recompute == "full":
        return t.layer_input / tp if sp else float(t.layer_input)
    routed = 0.0
    if moe_layer and m.moe is not None:
        etp = tp if etp is None else etp
        routed = routed_activation_bytes(
            m, routed_tokens(micro_batch, seq, tp, sp, etp), elem_bytes, ep=ep, etp=etp,
            capacity_factor=capacity_factor, imbalance=imbalance, eager=eager,
            input_bytes=input_bytes,
            act_recompute=recompute == "selective" and "moe_act" in modules,
            combine_bytes=combine_bytes, rows=rows)
    outside = t.outside_tp / tp if sp else t.outside_tp
    inside = t.inside_tp
    if recompute == "selective":
        # Megatron-Core's ``mlp`` (a dense layer's MLP checkpointed: its input, the norm's
        # output, kept) and ``mla_up_proj`` (latent attention's up projections' outputs, Q,
        # K and V, discarded and projected again from the kept latents).
        # ``moe`` (a MoE layer checkpointed whole: router, dispatch, experts, combine and
        # shared experts; its input kept) drops the routed part and the shared hidden.
        block = "moe" if moe_layer else "mlp"
        inside -= (t.mlp_hidden if block in modules else 0.0) + (
            t.up_proj if "mla_up_proj" in modules else 0.0)
        if moe_layer and "moe" in modules:
            routed = 0.0
    if recompute == "selective" and "layernorm" in modules and moe_layer:
        # The MoE layer's own pre-MLP norm: its output, the router's bf16 input, is dropped.
        outside -= seq * micro_batch * m.d_model * elem_bytes / (tp if sp else 1)
    if flash:
        core = 4.0 * m.heads * seq * micro_batch / tp  # softmax statistics only
        if eager and recompute != "selective":
            # torch's CPU fused kernel turns a boolean padding mask into an additive fp32
            # one, [b, 1, s, s], in every layer and keeps it for backward.
            core += 4.0 * micro_batch * seq * seq
    else:
        dropped = recompute == "selective" and (not modules or "core_attn" in modules)
        core = 0.0 if dropped else t.attention_core / tp
    return outside + inside / tp + core + routed


RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp",
                                      "moe")
"""Megatron-Core's ``--recompute-modules`` that shardlab prices (``recompute=selective``
with ``recompute_modules=``): ``core_attn`` (normal checkpoint of the attention core:
Korthikanti's selective, Megatron's default), ``layernorm`` (output-discarding: the norm
output of a layer whose norm is a module of its own, with Transformer Engine only the MoE
layer's pre-MLP norm, is dropped and the norm run again in backward) and ``moe_act``
(output-discarding: the grouped experts' activation output, fc2's input, dropped and the
activation run again from fc1's output); Megatron-LM transformer_layer.py and
moe/experts.py at d98e8a64 (``CheckpointWithoutOutput``). ``mla_up_proj``
(output-discarding: latent attention's up projections' outputs, Q, K and V, dropped and
projected again from the kept latents; multi_latent_attention.py) and ``mlp`` (a normal
checkpoint of a dense layer's MLP, its input kept: transformer_layer.py sets
``recompute_mlp`` only where the MLP is not a MoELayer) and ``moe`` (a normal checkpoint
of a whole MoE layer, moe_layer.py ``moe_layer_recompute``: router, dispatch, experts,
combine and shared experts run again, the layer's input kept)."""


def op_checkpoint_saves(m: ModelShape) -> tuple[bool, ...]:
    """Which of a dense block's linear matmuls, in the order its forward calls them (q, k,
    v, output; then gate, up, down for a gated MLP or up, down), have their outputs saved by
    torchtitan's per-operator selective checkpointing: every ``aten.mm`` "except every
    second mm" (``meta[mm_count_key] % 2 == 0`` is recomputed, a fresh counter per block:
    pytorch/torchtitan ``parallelize_llama.py`` ``_custom_policy``, commits 9dec370 and
    2887250b), so the 1st, 3rd, 5th and 7th: q, v, gate and down (SwiGLU). Latent
    attention's linears count in their own call order
    (:attr:`~shardlab.config.model.ModelShape.attention_linears`). A linear with a bias
    runs as ``aten.addmm``, which the policy saves without counting it (gpt style: every
    linear; ``qkv_bias``: q, k and v)."""
    biased = [m.biases or (m.qkv_bias and x.name in ("q", "k", "v"))
              for x in m.attention_linears] + [m.biases] * m.mlp_matrices
    saves, count = [], 0
    for bias in biased:
        count += not bias
        saves.append(bias or count % 2 == 1)
    return tuple(saves)


def op_checkpoint_layer_bytes(m: ModelShape, micro_batch: int, seq: int, elem_bytes: int = 2,
                              *, tp: int = 1, sp: bool = False) -> float:
    """Bytes one dense block keeps for backward under per-operator selective checkpointing,
    per micro-batch on one tensor-parallel rank (module docstring): the block's input
    (split by tp with sequence parallelism), the saved matmul outputs
    (:func:`op_checkpoint_saves`; a column-parallel output is split by tp, a row-parallel
    one, before its reduce-scatter, is whole), the attention kernel's output and fp32
    log-sum-exp (split by tp), and with sequence parallelism the two reduce-scatters'
    outputs (split by tp). Dropout masks: none (torchtitan's Llama has no dropout).
    torch 2.13 running torchtitan's policy on shardlab's block keeps 1.0026 x this
    (``tests/nn/test_op_checkpoint.py``)."""
    sb, e, h = seq * micro_batch, elem_bytes, m.d_model
    widths = [x.d_out / tp if x.split == "column" else x.d_out for x in m.attention_linears]
    widths += [m.d_ff / tp] * (m.mlp_matrices - 1) + [h]
    saved = sum(w for w, keep in zip(widths, op_checkpoint_saves(m), strict=True) if keep)
    block_input = h / tp if sp else h
    scatters = 2 * h / tp if sp and tp > 1 else 0.0
    kernel = m.o_dim / tp
    return e * sb * (block_input + saved + kernel + scatters) + 4.0 * m.heads * sb / tp


def sp_gathered_bytes(m: ModelShape, tokens: int, tp: int, sp: bool, elem_bytes: int,
                      gathered_bytes: int | None = None, inputs: int = 2) -> float:
    """Bytes per layer that DTensor's sequence parallelism keeps beyond Korthikanti's count:
    ``inputs`` linear inputs (the attention's, shared by q, k and v; the MLP's, shared by
    its first matrices) all-gathered over the sequence and saved whole, ``tokens`` x h
    each at ``gathered_bytes`` per element (default ``elem_bytes``; 1 where torchao's fp8
    tensor parallelism casts before the gather), where Megatron-LM keeps the T·h/t shard
    at ``elem_bytes`` and gathers it again in backward (Korthikanti et al. 2022, Sec.
    4.2.2). 0 without sp or with tp = 1. Seen in torch's program: the gathered input saved
    once at 1.00 x T·h (``benchmarks/sp_saved_inputs.py``, torch 2.13.0, tp 2 and 4) and in
    shardlab's dry run of Llama-3-8B at tp 8 (``docs/agree.md``)."""
    if inputs == 0 or not sp or tp == 1:
        return 0.0
    g = elem_bytes if gathered_bytes is None else gathered_bytes
    return inputs * tokens * m.d_model * max(g - elem_bytes / tp, 0.0)


def first_stage_extra_bytes(m: ModelShape, micro_batch: int, seq: int, *, tp: int = 1,
                            sp: bool = False, dropout: bool = True) -> float:
    """Embedding output dropout mask kept by the first stage, per micro-batch (1 byte/elem)."""
    mask = seq * micro_batch * m.d_model if dropout else 0
    return mask / tp if sp else float(mask)


LOGIT_BYTES = 4.0
"""Bytes per logit element the last stage keeps for the loss: the fp32 logits."""


def last_stage_extra_bytes(m: ModelShape, micro_batch: int, seq: int, elem_bytes: int = 2, *,
                           tp: int = 1, sp: bool = False) -> float:
    """Final norm input, head input and fp32 logits kept by the last stage, per micro-batch;
    each multi-token-prediction depth keeps its own (and its two norms' inputs and its
    projection's 2h-wide input: 4·s·b·h more)."""
    sb = seq * micro_batch
    heads = 1 + m.mtp_layers
    norm_and_head = (2 * heads + 4 * m.mtp_layers) * sb * m.d_model * elem_bytes
    return ((norm_and_head / tp if sp else norm_and_head)
            + heads * LOGIT_BYTES * sb * m.vocab / tp)


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                            recompute: str = "none") -> float:
    """Korthikanti et al. 2022 Table 2, as printed: bytes per layer (16-bit, with dropout)."""
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh
    if recompute == "selective":
        return sbh * 34 / t if sp else sbh * (10 + 24 / t)
    if sp:
        return sbh * (34 / t + 5 * a * s / (h * t))
    return sbh * (10 + 24 / t + 5 * a * s / (h * t))
