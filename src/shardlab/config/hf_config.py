"""A Hugging Face transformers ``config.json`` and a ModelShape, translated both ways.

:func:`shape_from_hf_config` builds the ModelShape a ``config.json`` describes;
:func:`hf_config` writes the ``config.json`` transformers builds shardlab's model from
(the family :func:`hf_family` picks: ``llama``, ``qwen2`` when q/k/v carry biases, or
``gpt2``; the weights themselves are :mod:`shardlab.hf.weights`). Both need no torch.

Reading a config.json:

Each family keeps its own field names and its own defaults, and the importer follows
the configuration class that transformers loads the file into (``LlamaConfig``,
``MistralConfig``, ``MixtralConfig``, ``Qwen2Config``, ``GPT2Config`` in
``transformers/models/<family>/configuration_<family>.py``) and the modeling code
that builds the weights from it:

* ``llama`` (LlamaConfig): ``hidden_size``, ``num_hidden_layers``,
  ``num_attention_heads``, ``num_key_value_heads`` (absent or null: =
  ``num_attention_heads``), ``intermediate_size``, ``vocab_size``,
  ``max_position_embeddings``, ``head_dim`` (absent or null: ``hidden_size //
  num_attention_heads``), ``tie_word_embeddings`` (absent: false).
  ``attention_bias`` puts a bias on q, k, v *and* o (LlamaAttention) and ``mlp_bias``
  on the three MLP matrices; ModelShape has neither, so either one true is refused.
* ``mistral`` (MistralConfig): the llama fields, but an absent
  ``num_key_value_heads`` is the class default 8; only an explicit null means
  ``num_attention_heads``. No bias flags: MistralAttention has no biases at all.
* ``mixtral`` (MixtralConfig): as mistral, plus ``num_local_experts`` and
  ``num_experts_per_tok``; every expert has width ``intermediate_size`` and the router
  (MixtralSparseMoeBlock.gate) has no bias. Refused, as shardlab computes or trains
  otherwise: ``sliding_window`` below ``max_position_embeddings``, ``router_jitter_noise``
  not 0, ``output_router_logits`` true (one aux loss over all layers' tokens pooled).
* ``qwen2`` (Qwen2Config): the llama fields with biases on q, k, v but not o
  (Qwen2Attention, hard-wired); an absent ``num_key_value_heads`` is the class default
  32, an explicit null means ``num_attention_heads``.
* ``qwen3`` (Qwen3Config) and ``qwen3_moe`` (Qwen3MoeConfig): the llama fields, an
  RMSNorm of ``head_dim`` on each head's query and key (Qwen3Attention's ``q_norm``,
  ``k_norm``: ``qk_norm``), no biases (``attention_bias`` true is refused, as llama's);
  ``head_dim`` and ``num_key_value_heads`` must be given (every published file gives
  them). ``qwen3_moe`` adds ``num_experts``, ``num_experts_per_tok`` and
  ``moe_intermediate_size`` (Qwen3MoeSparseMoeBlock, a bias-free router); a MoE block in
  every layer: ``decoder_sparse_step`` 1 and no ``mlp_only_layers``. ``use_sliding_window``
  true is refused. shardlab prices these shapes; its runtime does not build them.
* ``deepseek_v2``, ``deepseek_v3``, ``kimi_k2``: latent attention and DeepSeek's MoE
  (:mod:`shardlab.config.hf_deepseek`), priced only.
* ``gpt2`` (GPT2Config): ``n_embd``, ``n_layer``, ``n_head``, ``n_positions`` (absent:
  the older ``n_ctx``), ``vocab_size``, ``n_inner`` (absent or null: 4 * ``n_embd``,
  GPT2Block), ``tie_word_embeddings`` (absent: true, the PretrainedConfig default);
  ``add_cross_attention`` true adds encoder-attention weights and is refused.

What the shape does not hold but the model computes, :func:`check_computable` checks for
``shardlab import``: the rotary positions (``rope_theta``, ``rope_parameters``,
``rope_scaling``), the activation and the norm eps.

Where transformers would fill a sizing field (``hidden_size``, ``vocab_size``, expert
counts, ...) from its class default we refuse instead: a config.json without it
describes no published checkpoint, and a silent 4096 would be a guess.
A file without ``model_type`` is identified by ``architectures[0]``.

Writing one (export): the constants shardlab's model is built with go in, as
transformers' fields: RMSNorm eps 1e-6 (``rms_norm_eps``) and LayerNorm eps 1e-5
(``layer_norm_epsilon``, :func:`shardlab.nn.model.make_norm`), SwiGLU with SiLU
(``hidden_act: silu``), GELU tanh (``activation_function: gelu_pytorch_tanh``), and the
rotary base (``rope_theta``) the shape carries (10 000 when a file gives none).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardlab.config.files import read_input_text
from shardlab.config.hf_deepseek import DEEPSEEK_ARCHITECTURES, DEEPSEEK_FAMILIES, deepseek_fields
from shardlab.config.model import LN_EPS, RMS_EPS, ROPE_THETA, ModelShape, MoE
from shardlab.errors import SpecError

Config = dict[str, Any]

FAMILIES: tuple[str, ...] = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe",
                             "gpt2", *DEEPSEEK_FAMILIES)
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GPT2LMHeadModel": "gpt2", **DEEPSEEK_ARCHITECTURES,
}

# What an *absent* num_key_value_heads means: the config class's own default
# (None for Llama, then = heads; a literal 8 for Mistral/Mixtral, 32 for Qwen2).
_ABSENT_KV_HEADS: dict[str, int | None] = {"llama": None, "mistral": 8, "mixtral": 8,
                                           "qwen2": 32, "qwen3": None, "qwen3_moe": None,
                                           **dict.fromkeys(DEEPSEEK_FAMILIES)}
_MISSING = object()
# GPT2Config's default activation is gelu_new: the same tanh approximation of GELU as
# gelu_pytorch_tanh (transformers' NewGELUActivation), which export writes.
_GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")


def shape_from_hf_config(path: str | Path, name: str | None = None) -> ModelShape:
    """The ModelShape a Hugging Face ``config.json`` describes.

    ``name`` defaults to the file's ``_name_or_path``, else the folder name for a
    file called ``config.json``, else the file's stem. Bad input raises SpecError.
    """
    path = Path(path)
    config = load_config(path)
    family = _family(config)
    fields = _BUILDERS[family](_Reader(config, family))
    if fields.get("style", "llama") == "llama":
        fields["rope_theta"] = rope_theta_of(config)
    shape_name = name if name is not None else _default_name(config, path)
    return ModelShape(name=shape_name, source=f"Hugging Face config.json at {path}", **fields)


def load_config(path: Path) -> Config:
    """The top-level JSON object of ``path``; every way of failing is one SpecError."""
    # A regular file of at most 1 MiB, read as UTF-8 (a BOM tolerated): never /dev/zero.
    text = read_input_text("config", path)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError
        raise SpecError("config", str(path), f"is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise SpecError("config", str(path),
                        f"must hold a JSON object at the top level, not {type(data).__name__}")
    return data


def _family(config: Config) -> str:
    """``model_type``, or the family ``architectures[0]`` names when it is absent."""
    allowed = f"must be one of {', '.join(FAMILIES)}"
    if "model_type" in config:
        model_type = config["model_type"]
        if model_type not in FAMILIES:
            raise SpecError("model_type", model_type, allowed)
        return str(model_type)
    architectures = config.get("architectures")
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    if isinstance(first, str) and first in ARCHITECTURES:
        return ARCHITECTURES[first]
    raise SpecError("model_type", None,
                    f"is missing, and architectures[0]={first!r} is not one of "
                    f"{', '.join(ARCHITECTURES)}; model_type {allowed}")


def _default_name(config: Config, path: Path) -> str:
    """``_name_or_path`` if set; else the snapshot folder's name or the file's stem."""
    stored = config.get("_name_or_path")
    if isinstance(stored, str) and stored:
        return stored
    # A downloaded model is a folder holding config.json: the folder is the name.
    if path.stem == "config" and path.parent.name:
        return path.parent.name
    return path.stem


class _Reader:
    """Typed access to one config's fields, with errors that name the field."""

    def __init__(self, config: Config, family: str) -> None:
        self.config = config
        self.family = family

    def positive_int(self, field: str, default: object = _MISSING) -> int:
        """A required positive integer; ``default`` (if given) stands in when absent."""
        value = self.config.get(field, default)
        if value is _MISSING:
            raise SpecError(field, None,
                            f"is missing from config.json (needed for {self.family})")
        # bool is an int subclass: refuse "hidden_size": true.
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(field, value,
                            f"must be a positive integer ({self.family} config.json)")
        return value

    def optional_int(self, field: str, fallback: int) -> int:
        """A positive integer that, absent or null, is ``fallback``."""
        if self.config.get(field) is None:
            return fallback
        return self.positive_int(field)

    def flag(self, field: str, default: bool) -> bool:
        """A true/false field, ``default`` when absent."""
        value = self.config.get(field, default)
        if not isinstance(value, bool):
            raise SpecError(field, value, f"must be true or false ({self.family} config.json)")
        return value

    def refuse_true(self, field: str, why: str) -> None:
        """Raise when the boolean ``field`` is true: it adds weights ModelShape lacks."""
        if self.flag(field, False):
            raise SpecError(field, True, f"is not supported: {why}")


def _rotary(r: _Reader) -> dict[str, Any]:
    """Fields common to the RMSNorm + SwiGLU + RoPE families (llama, mistral, ...)."""
    d_model = r.positive_int("hidden_size")
    heads = r.positive_int("num_attention_heads")
    kv_heads = _kv_heads(r, heads)
    return {
        "layers": r.positive_int("num_hidden_layers"),
        "d_model": d_model,
        "heads": heads,
        "vocab": r.positive_int("vocab_size"),
        "context": r.positive_int("max_position_embeddings"),
        "kv_heads": kv_heads,
        # transformers floors hidden_size // heads when head_dim is unset; passing the
        # floored value keeps the shape identical to the module it would build (a floor
        # of 0 passes 0, and ModelShape then refuses heads that do not divide d_model).
        "head_dim": r.optional_int("head_dim", d_model // heads),
        "d_ff": r.positive_int("intermediate_size"),
        "style": "llama",
        "tied": r.flag("tie_word_embeddings", False),
    }


def _kv_heads(r: _Reader, heads: int) -> int:
    """num_key_value_heads: explicit null means = heads; absent means the class default."""
    if "num_key_value_heads" not in r.config:
        absent = _ABSENT_KV_HEADS[r.family]
        return heads if absent is None else absent
    return r.optional_int("num_key_value_heads", heads)


def _llama(r: _Reader) -> dict[str, Any]:
    r.refuse_true("attention_bias", "LlamaAttention then biases q, k, v and o; "
                                    "ModelShape models q/k/v biases only")
    r.refuse_true("mlp_bias", "ModelShape has no MLP biases in llama style")
    return _rotary(r)


def _mixtral(r: _Reader) -> dict[str, Any]:
    fields = _rotary(r)
    experts = r.positive_int("num_local_experts")
    top_k = r.positive_int("num_experts_per_tok")
    if top_k > experts:  # checked here so the error names the config.json field
        raise SpecError("num_experts_per_tok", top_k,
                        f"must be <= num_local_experts ({experts})")
    window = r.config.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < fields["context"]):
        raise SpecError("sliding_window", window, "must be null (or at least "
                        f"max_position_embeddings, {fields['context']}): shardlab's "
                        "attention sees the whole causal prefix")
    jitter = r.config.get("router_jitter_noise", 0.0)
    if isinstance(jitter, bool) or not isinstance(jitter, int | float) or jitter != 0:
        raise SpecError("router_jitter_noise", jitter, "must be 0: shardlab's router "
                        "adds no noise to the hidden states in training")
    if r.flag("output_router_logits", False):
        raise SpecError("output_router_logits", True, "must be false: transformers then "
                        "adds one load-balancing loss over all layers' tokens pooled to the "
                        "loss; shardlab's auxiliary loss is a per-layer training option")
    fields["moe"] = MoE(experts=experts, experts_per_token=top_k, expert_d_ff=fields["d_ff"])
    return fields


def _qwen2(r: _Reader) -> dict[str, Any]:
    # Qwen2Attention hard-wires bias=True on q/k/v (and False on o); no config flag.
    return {**_rotary(r), "qkv_bias": True}


def _qwen3(r: _Reader) -> dict[str, Any]:
    r.refuse_true("attention_bias", "Qwen3Attention then biases q, k, v and o; "
                                    "ModelShape models q/k/v biases only")
    r.refuse_true("use_sliding_window", "shardlab's attention sees the whole causal prefix")
    r.positive_int("head_dim")  # required: the classes' defaults differ from d / heads
    r.positive_int("num_key_value_heads")
    return {**_rotary(r), "qk_norm": True}


def _qwen3_moe(r: _Reader) -> dict[str, Any]:
    fields = _qwen3(r)
    experts = r.positive_int("num_experts")
    top_k = r.positive_int("num_experts_per_tok")
    if top_k > experts:
        raise SpecError("num_experts_per_tok", top_k, f"must be <= num_experts ({experts})")
    why = "a MoE block in every layer (ModelShape's dense layers lead the model)"
    if r.config.get("decoder_sparse_step", 1) != 1:
        raise SpecError("decoder_sparse_step", r.config["decoder_sparse_step"],
                        f"must be 1: {why}")
    if r.config.get("mlp_only_layers"):
        raise SpecError("mlp_only_layers", r.config["mlp_only_layers"], f"must be empty: {why}")
    fields["moe"] = MoE(experts=experts, experts_per_token=top_k,
                        expert_d_ff=r.positive_int("moe_intermediate_size"))
    return fields


def _gpt2(r: _Reader) -> dict[str, Any]:
    r.refuse_true("add_cross_attention", "it adds encoder-attention weights to every block")
    d_model = r.positive_int("n_embd")
    # n_ctx is the pre-4.x name of the position-table size; newer files carry both.
    context = r.positive_int("n_positions", r.config.get("n_ctx", _MISSING))
    return {
        "layers": r.positive_int("n_layer"),
        "d_model": d_model,
        "heads": r.positive_int("n_head"),
        "vocab": r.positive_int("vocab_size"),
        "context": context,
        "d_ff": r.optional_int("n_inner", 4 * d_model),
        "style": "gpt",
        "tied": r.flag("tie_word_embeddings", True),
    }


def _deepseek(r: _Reader) -> dict[str, Any]:
    r.refuse_true("attention_bias", "DeepSeek's attention then biases its projections")
    fields = _rotary(r)
    return {**fields, **deepseek_fields(r, fields["heads"])}


_BUILDERS: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "llama": _llama, "mistral": _rotary, "mixtral": _mixtral, "qwen2": _qwen2,
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "gpt2": _gpt2,
    **dict.fromkeys(DEEPSEEK_FAMILIES, _deepseek),
}


# --- what the model computes beyond its shape (import) ------------------------------

def check_computable(config: Config, style: str) -> list[str]:
    """Refuse a config.json whose model computes what shardlab's would not (another rotary
    base, scaled rotary positions, another activation); return notes for what only nudges
    the logits (another norm eps). ``style`` is the shape's (``llama`` or ``gpt``).

    A Qwen3-MoE router that does not renormalise its top-k weights (``norm_topk_prob``
    false, Qwen3MoeConfig's default) is refused.

    Rotary positions are read as both transformers generations do, so a file either one
    would scale is refused: 4.x reads ``rope_theta`` and ``rope_scaling``; 5.x reads
    ``rope_parameters``, replaced wholesale by a non-empty ``rope_scaling``, with the
    legacy key ``type`` standing for ``rope_type``. Every present theta must be the same
    finite number > 0 (:func:`rope_theta_of`: the shape's) and every present rope type
    ``default``. SpecError names the field.
    """
    if config.get("model_type") == "qwen3_moe" and config.get("norm_topk_prob") is not True:
        # Qwen3MoeConfig's default is false: the top-k softmax weights left as they are.
        raise SpecError("norm_topk_prob", config.get("norm_topk_prob", False), "must be true: "
                        "shardlab's router renormalises each token's top-k weights (Mixtral's)")
    if style == "llama":
        rope_theta_of(config)
        for name in ("rope_parameters", "rope_scaling"):
            _check_rope_dict(name, config.get(name))
        act_field, allowed, default = "hidden_act", ("silu",), "silu"
    else:
        act_field, allowed, default = "activation_function", _GPT2_ACTIVATIONS, "gelu_new"
    act = config.get(act_field, default)
    if not isinstance(act, str) or act not in allowed:
        raise SpecError(act_field, act, f"must be {' or '.join(allowed)}: shardlab's "
                        f"{style}-style MLP computes that activation only")
    eps_field, ours = ("rms_norm_eps", RMS_EPS) if style == "llama" else (
        "layer_norm_epsilon", LN_EPS)
    eps = config.get(eps_field)
    if eps is None:  # absent or null: the config class's default, which is ours
        return []
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < float("inf"):
        raise SpecError(eps_field, eps, "must be a finite number > 0")
    if eps == ours:
        return []
    return [f"norm eps {eps} in config.json, shardlab's model uses {ours:g}: logits differ "
            "slightly"]


def rope_theta_of(config: Config) -> float:
    """The rotary base a config.json states: ``rope_theta`` (transformers 4.x), or
    ``rope_parameters.rope_theta`` / ``rope_scaling.rope_theta`` (5.x); 10 000 when none
    does. SpecError naming the field when one is not a finite number > 0, or two differ
    (which would transformers use?)."""
    found: list[tuple[str, float]] = []
    places = [("rope_theta", config)]
    places += [(f"{name}.rope_theta", config.get(name)) for name in ("rope_parameters",
                                                                    "rope_scaling")]
    for field, holder in places:
        if not isinstance(holder, dict) or "rope_theta" not in holder:
            continue
        value = holder["rope_theta"]
        # bool is an int subclass: true would pass as 1.
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value <= 0):
            raise SpecError(field, value, "must be a finite number > 0 (the rotary base)")
        if found and value != found[0][1]:
            raise SpecError(field, value, f"must equal {found[0][0]} ({found[0][1]:g}): "
                            "one rotary base")
        found.append((field, float(value)))
    return found[0][1] if found else ROPE_THETA


def _check_rope_dict(name: str, value: object) -> None:
    """``rope_parameters`` or ``rope_scaling``: null, or an object with the default type."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise SpecError(name, value, "must be a JSON object or null")
    for key in ("rope_type", "type"):
        if key in value and value[key] != "default":
            raise SpecError(f"{name}.{key}", value[key], "must be default: rope scaling is not "
                            "supported (shardlab's rotary positions are unscaled)")
