"""ModelShape: the architecture of a decoder-only transformer LM, as numbers.

Two styles cover the models shardlab knows:

* ``gpt``: LayerNorm (scale and shift), biases on every linear layer, GELU MLP
  with two matrices, learned absolute positions (GPT-2, GPT-3).
* ``llama``: RMSNorm (scale only), no biases (except q/k/v biases where
  ``qkv_bias`` is set, as in the Qwen2 family), SwiGLU MLP with three matrices,
  rotary positions with no parameters (Llama, Mistral, Mixtral, Qwen2); ``qk_norm``
  adds an RMSNorm of head_dim on each head's query and key (Qwen3).

Mixture-of-experts layers (``moe``) replace the MLP with ``experts`` expert MLPs
of width ``expert_d_ff``, a linear router of ``d_model x experts`` and
``shared_experts`` always-on experts; each token goes through
``experts_per_token`` routed experts.

Multi-head latent attention (``mla``: DeepSeek-V2, arXiv 2405.04434 Sec. 2.1; DeepSeek-V3,
arXiv 2412.19437) replaces the Q, K and V projections with low-rank ones: the input is
projected down to a latent of ``kv_lora_rank`` (plus one shared rotary key of
``qk_rope_head_dim``) and, with ``q_lora_rank``, a query latent; each latent is
RMS-normed and projected up to every head's key (``qk_nope_head_dim``, joined by the
shared rotary part) and value (``v_head_dim``) and query (nope + rope). The down
projections are whole on every tensor-parallel rank (Megatron-LM's ``gpt_layer_specs``:
``linear_q_down_proj=backend.linear()``, a duplicated layer; the up projections are
column-parallel), so a layer's attention is :attr:`ModelShape.attention_linears`, not
four matrices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from shardlab.config.limits import (
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_FF,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
)
from shardlab.errors import (
    SpecError,
    require_int_at_most,
    require_nonnegative_int,
    require_positive_int,
    require_positive_number,
)

Style = Literal["gpt", "llama"]
STYLES: tuple[str, ...] = ("gpt", "llama")


RMS_EPS = 1e-6
"""The epsilon of llama-style RMSNorm (Zhang & Sennrich 2019), as Llama's config.json."""

LN_EPS = 1e-5
"""The epsilon of GPT-style LayerNorm (Ba et al. 2016), as GPT-2's config.json."""

ROPE_THETA = 10_000.0
"""The rotary embedding's default base (Su et al. 2021; Llama 1 and 2): a shape's
``rope_theta`` when none is given (a config.json without one, a model from flags)."""


SHAPE_LIMITS: dict[str, int] = {
    "layers": MAX_LAYERS, "d_model": MAX_WIDTH, "head_dim": MAX_WIDTH, "heads": MAX_HEADS,
    "kv_heads": MAX_HEADS, "d_ff": MAX_FF, "vocab": MAX_VOCAB, "context": MAX_CONTEXT,
}
"""The largest value of each shape field (:mod:`shardlab.config.limits`): past these the
counts are typos, and their figures would lose their precision."""


MOE_ROUTINGS = ("learned", "contiguous")
"""How a built MoE layer picks each token's experts (``train --routing``): its router's
top-k (``learned``), or a forced cycle whose counts are known in advance (``contiguous``,
:mod:`shardlab.nn.moe_contiguous`; what ``dryrun`` runs)."""


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts MLP: routed experts, top-k routing, optional shared experts.

    ``expert_d_ff`` is the hidden width of one expert; ``shared_d_ff`` of one shared
    expert (defaults to ``expert_d_ff``). ``dense_layers`` first layers keep a dense
    MLP of the model's ``d_ff`` (DeepSeek-style); the rest are MoE layers.
    """

    experts: int
    experts_per_token: int
    expert_d_ff: int
    shared_experts: int = 0
    shared_d_ff: int = 0
    router_bias: bool = False
    dense_layers: int = 0
    groups: int = 1
    """Group-limited routing (DeepSeek's node-limited routing, config.json ``n_group``,
    Megatron-Core's ``--moe-router-num-groups``): the experts in ``groups`` consecutive
    groups, each token's experts drawn from the ``group_topk`` groups whose top
    experts_per_token / group_topk scores sum highest (``topk_group``,
    ``--moe-router-group-topk``); 1: no limit."""
    group_topk: int = 1

    def __post_init__(self) -> None:
        require_positive_int("moe.experts", self.experts)
        require_positive_int("moe.experts_per_token", self.experts_per_token)
        require_positive_int("moe.expert_d_ff", self.expert_d_ff)
        require_nonnegative_int("moe.shared_experts", self.shared_experts)
        require_nonnegative_int("moe.shared_d_ff", self.shared_d_ff)
        require_nonnegative_int("moe.dense_layers", self.dense_layers)
        for name, limit in (("experts", MAX_EXPERTS), ("shared_experts", MAX_EXPERTS),
                            ("expert_d_ff", MAX_FF), ("shared_d_ff", MAX_FF)):
            require_int_at_most(f"moe.{name}", getattr(self, name), limit)
        if self.experts_per_token > self.experts:
            raise SpecError("moe.experts_per_token", self.experts_per_token,
                            f"must be <= moe.experts ({self.experts})")
        if self.shared_d_ff == 0:
            object.__setattr__(self, "shared_d_ff", self.expert_d_ff)
        require_positive_int("moe.groups", self.groups)
        if self.experts % self.groups:
            raise SpecError("moe.groups", self.groups,
                            f"must divide moe.experts ({self.experts})")
        require_positive_int("moe.group_topk", self.group_topk)
        if self.group_topk > self.groups or (self.groups > 1 and (
                self.experts_per_token % self.group_topk
                or self.group_topk * self.experts // self.groups < self.experts_per_token)):
            raise SpecError("moe.group_topk", self.group_topk,
                            f"must be <= moe.groups ({self.groups}), divide "
                            f"experts_per_token ({self.experts_per_token}) and leave that "
                            "many experts in the chosen groups")


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention's widths (module docstring), per token: the key/value
    latent ``kv_lora_rank``, the query latent ``q_lora_rank`` (0: queries projected
    directly, as DeepSeek-V2-Lite), and per head the key's ``qk_nope_head_dim`` and
    ``qk_rope_head_dim`` (the rotary part, one key shared by all heads) and the value's
    ``v_head_dim``. Names as DeepSeek's config.json."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            require_positive_int(f"mla.{name}", getattr(self, name))
            require_int_at_most(f"mla.{name}", getattr(self, name), MAX_WIDTH)
        require_nonnegative_int("mla.q_lora_rank", self.q_lora_rank)
        require_int_at_most("mla.q_lora_rank", self.q_lora_rank, MAX_WIDTH)

    @property
    def qk_head_dim(self) -> int:
        """A head's query and key width: nope + rope."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class AttentionLinear:
    """One linear layer of an attention block: ``d_in`` x ``d_out`` weights, and how
    tensor parallelism splits it: ``column`` (its outputs over tp), ``row`` (its inputs
    over tp) or ``duplicated`` (whole on every tp rank). ``reads_input``: it reads the
    block's (normed) input, T x d_model, which sequence parallelism gathers."""

    name: str
    d_in: int
    d_out: int
    split: Literal["column", "row", "duplicated"]
    reads_input: bool = False


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer, as the integers that fix its cost.

    ``kv_heads`` (0 means = ``heads``: multi-head attention; fewer is GQA, 1 is MQA),
    ``head_dim`` (0 means ``d_model // heads``; Hugging Face configs may set it
    explicitly, e.g. Gemma, Mistral-Nemo), ``d_ff`` (0 means 4 * d_model).
    ``context`` is the trained sequence length in tokens; for ``gpt`` style it is
    also the size of the learned position table. ``rope_theta`` is the rotary base of a
    ``llama``-style model (Su et al. 2021: 10 000; Llama 3 500 000, Mixtral 1 000 000);
    it changes what the model computes, never its cost.
    """

    name: str
    layers: int
    d_model: int
    heads: int
    vocab: int
    context: int
    kv_heads: int = 0
    head_dim: int = 0
    d_ff: int = 0
    style: Style = "gpt"
    tied: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    """RMSNorm over each head's query and key before rotary (Qwen3: ``q_norm``/``k_norm``,
    head_dim weights each, :class:`shardlab.nn.model.Attention`)."""
    moe: MoE | None = None
    mla: MLA | None = None
    """Multi-head latent attention (module docstring): ``head_dim`` is then its query/key
    head width (nope + rope) and ``kv_heads`` = ``heads``. Priced by budget and plan;
    shardlab's runtime does not build it (:func:`require_buildable`)."""
    rope_theta: float = ROPE_THETA
    mtp_layers: int = 0
    """Multi-token prediction (DeepSeek-V3, arXiv 2412.19437 Sec. 2.2; Megatron-Core's
    ``--mtp-num-layers``): the last ``mtp_layers`` of ``layers`` are prediction depths,
    each a transformer block of the model's last kind fed by a projection of its two
    normed inputs (2·d_model to d_model) and scored through the shared embedding and head
    once more. A training-time module: a checkpoint as transformers builds it has none."""
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("layers", "d_model", "heads", "vocab", "context"):
            require_positive_int(name, getattr(self, name))
        for name in ("kv_heads", "head_dim", "d_ff"):
            require_nonnegative_int(name, getattr(self, name))
        for name, limit in SHAPE_LIMITS.items():
            require_int_at_most(name, getattr(self, name), limit)
        theta = require_positive_number("rope_theta", self.rope_theta)
        if not math.isfinite(theta):
            raise SpecError("rope_theta", self.rope_theta, "must be a finite number > 0")
        object.__setattr__(self, "rope_theta", float(theta))
        if self.style not in STYLES:
            raise SpecError("style", self.style, f"must be one of {', '.join(STYLES)}")
        if self.mla is not None:
            self._check_mla(self.mla)
        if self.qk_norm and self.style != "llama":
            raise SpecError("qk_norm", True, f"needs style llama, not {self.style}: Qwen3's "
                            "query/key norms are RMSNorms before rotary")
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim == 0:
            if self.d_model % self.heads:
                raise SpecError("heads", self.heads,
                                f"must divide d_model ({self.d_model}) unless head_dim is given")
            object.__setattr__(self, "head_dim", self.d_model // self.heads)
        if self.d_ff == 0:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        if self.heads % self.kv_heads:
            raise SpecError("kv_heads", self.kv_heads,
                            f"must divide heads ({self.heads}): each kv head serves a group")
        require_nonnegative_int("mtp_layers", self.mtp_layers)
        if self.mtp_layers >= self.layers:
            raise SpecError("mtp_layers", self.mtp_layers,
                            f"must be < layers ({self.layers}): they are the last layers")
        if self.moe is not None and self.moe.dense_layers > self.layers:
            raise SpecError("moe.dense_layers", self.moe.dense_layers,
                            f"must be <= layers ({self.layers})")

    def _check_mla(self, mla: MLA) -> None:
        """Latent attention gives every head its own key and value, of nope + rope width, in a
        llama-style block without q/k/v biases or query/key norms (DeepSeek's)."""
        for name, bad in (("style", self.style != "llama"), ("qkv_bias", self.qkv_bias),
                          ("qk_norm", self.qk_norm)):
            if bad:
                raise SpecError(name, getattr(self, name), "latent attention (mla) is "
                                "DeepSeek's: llama style, no q/k/v biases, no query/key norms")
        if self.kv_heads not in (0, self.heads):
            raise SpecError("kv_heads", self.kv_heads,
                            f"must equal heads ({self.heads}) with latent attention (mla)")
        if self.head_dim not in (0, mla.qk_head_dim):
            raise SpecError("head_dim", self.head_dim, "must be mla.qk_nope_head_dim + "
                            f"mla.qk_rope_head_dim ({mla.qk_head_dim}) with latent attention")
        object.__setattr__(self, "head_dim", mla.qk_head_dim)

    @property
    def q_dim(self) -> int:
        """Width of the query projection output: heads * head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key projection output (and of the value's, without latent
        attention): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def v_head_dim(self) -> int:
        """A head's value width: head_dim, or latent attention's ``v_head_dim``."""
        return self.head_dim if self.mla is None else self.mla.v_head_dim

    @property
    def v_dim(self) -> int:
        """Width of the value projection output: kv_heads * v_head_dim (= kv_dim without
        latent attention)."""
        return self.kv_heads * self.v_head_dim

    @property
    def o_dim(self) -> int:
        """Width of the attention output, the output projection's input: heads *
        v_head_dim (= q_dim without latent attention)."""
        return self.heads * self.v_head_dim

    @property
    def attention_weights(self) -> int:
        """Weights of the attention block's linear layers, d_in x d_out summed over
        :attr:`attention_linears` (no biases, no norms)."""
        return sum(x.d_in * x.d_out for x in self.attention_linears)

    @property
    def attention_linears(self) -> tuple[AttentionLinear, ...]:
        """The attention block's linear layers in the order its forward calls them: Q, K,
        V (column-parallel) and the output (row-parallel); with latent attention the query
        (down, duplicated, and up, column-parallel; or one column-parallel projection
        without a query latent), the key/value down projection (latent plus the shared
        rotary key, duplicated), the key/value up projection (every head's nope key and
        value, column-parallel) and the output (DeepSeek-V3's ``modeling_deepseek.py``:
        q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj)."""
        h, a = self.d_model, self.mla
        out = AttentionLinear("o", self.o_dim, h, "row")
        if a is None:
            return (AttentionLinear("q", h, self.q_dim, "column", True),
                    AttentionLinear("k", h, self.kv_dim, "column", True),
                    AttentionLinear("v", h, self.v_dim, "column", True), out)
        if a.q_lora_rank:
            query: tuple[AttentionLinear, ...] = (
                AttentionLinear("q_down", h, a.q_lora_rank, "duplicated", True),
                AttentionLinear("q_up", a.q_lora_rank, self.q_dim, "column"))
        else:
            query = (AttentionLinear("q", h, self.q_dim, "column", True),)
        return (*query,
                AttentionLinear("kv_down", h, a.kv_lora_rank + a.qk_rope_head_dim,
                                "duplicated", True),
                AttentionLinear("kv_up", a.kv_lora_rank,
                                self.heads * (a.qk_nope_head_dim + a.v_head_dim), "column"),
                out)

    @property
    def biases(self) -> bool:
        """Whether every linear layer carries a bias (gpt style)."""
        return self.style == "gpt"

    @property
    def mlp_matrices(self) -> int:
        """Matrices in one dense MLP: 2 for GELU (up, down), 3 for SwiGLU (gate, up, down)."""
        return 2 if self.style == "gpt" else 3

    @property
    def moe_layers(self) -> int:
        """How many layers carry a mixture-of-experts MLP (0 for a dense model)."""
        return 0 if self.moe is None else self.layers - self.moe.dense_layers

    @property
    def dense_layers(self) -> int:
        """How many layers carry a dense MLP of width d_ff."""
        return self.layers - self.moe_layers

    def describe(self) -> str:
        """One line: style, layers, width, heads, vocab, context."""
        gqa = f" kv={self.kv_heads}" if self.kv_heads != self.heads else ""
        moe = (f" moe={self.moe.experts}x top{self.moe.experts_per_token}"
               if self.moe else "")
        if self.mla is not None:
            a = self.mla
            gqa = (f" mla=kv{a.kv_lora_rank}/q{a.q_lora_rank}/rope{a.qk_rope_head_dim}"
                   f"/v{a.v_head_dim}")
        return (f"{self.style} L={self.layers} d={self.d_model} heads={self.heads}{gqa} "
                f"hd={self.head_dim} ff={self.d_ff} V={self.vocab} ctx={self.context}"
                f"{' tied' if self.tied else ''}{' qk_norm' if self.qk_norm else ''}{moe}"
                f"{f' rope_theta={self.rope_theta:g}' if self.rope_theta != ROPE_THETA else ''}"
                f"{f' mtp={self.mtp_layers}' if self.mtp_layers else ''}")


def with_mtp(shape: ModelShape, depths: int) -> ModelShape:
    """``shape`` trained with ``depths`` multi-token-prediction depths: that many layers of
    its last kind appended as :attr:`ModelShape.mtp_layers` (``--mtp-layers``; 0 gives
    ``shape`` back)."""
    require_nonnegative_int("mtp_layers", depths)
    if not depths:
        return shape
    return replace(shape, layers=shape.layers + depths, mtp_layers=shape.mtp_layers + depths)


def served(shape: ModelShape) -> ModelShape:
    """``shape`` as it is served: its multi-token-prediction depths dropped (a checkpoint as
    transformers builds it has none; inference prices this)."""
    if not shape.mtp_layers:
        return shape
    return replace(shape, layers=shape.layers - shape.mtp_layers, mtp_layers=0)


def runtime_builds(shape: ModelShape) -> bool:
    """Whether shardlab's runtime model builds ``shape`` (:func:`require_buildable`)."""
    try:
        require_buildable(shape)
    except SpecError:
        return False
    return True


def require_buildable(shape: ModelShape) -> None:
    """One-line SpecError for a shape shardlab's runtime model does not build: latent
    attention (DeepSeek, :attr:`ModelShape.mla`) or multi-token prediction
    (:attr:`ModelShape.mtp_layers`), which budget and plan price."""
    if shape.mla is not None:
        raise SpecError("mla", "latent attention", f"{shape.name}: shardlab's model has no "
                        "multi-head latent attention (DeepSeek); budget and plan price this "
                        "shape, but train, simulate and dryrun need one without")
    if shape.mtp_layers:
        raise SpecError("mtp_layers", shape.mtp_layers, f"{shape.name}: shardlab's model has "
                        "no multi-token prediction; budget and plan price it, but train, "
                        "simulate and dryrun need a shape without")
