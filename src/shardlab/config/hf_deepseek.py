"""DeepSeek's ``config.json`` families, read into a ModelShape: ``deepseek_v2``
(DeepSeek-V2, V2-Lite), ``deepseek_v3`` (DeepSeek-V3, R1) and ``kimi_k2`` (Moonshot's
Kimi K2, DeepSeek-V3's architecture at other sizes).

What each field means follows transformers' ``DeepseekV3Config`` and the modeling code
the checkpoints ship (``modeling_deepseek.py``):

* attention is latent (``mla``): ``kv_lora_rank``, ``q_lora_rank`` (null: queries
  projected directly, V2-Lite), ``qk_nope_head_dim``, ``qk_rope_head_dim``,
  ``v_head_dim``; ``num_key_value_heads`` must equal ``num_attention_heads`` (every head
  has its own decompressed key and value);
* ``first_k_dense_replace`` leading layers keep a dense MLP of ``intermediate_size``, the
  rest are MoE layers of ``n_routed_experts`` experts of ``moe_intermediate_size``, top
  ``num_experts_per_tok``, and ``n_shared_experts`` shared experts (one MLP of
  n x moe_intermediate_size); ``moe_layer_freq`` must be 1 (every layer past the dense
  ones is MoE); with ``n_routed_experts`` null or every layer dense, the model is dense;
* ``n_group`` and ``topk_group`` limit each token's experts to its best ``topk_group`` of
  ``n_group`` groups (DeepSeek-V3's node-limited routing: 8 and 4), unless ``topk_method``
  is ``greedy`` (the top k over all experts);
* ``topk_method`` ``noaux_tc`` (V3, K2) gives each router a per-expert
  ``e_score_correction_bias``, a tensor of the checkpoint (``router_bias``);
* the multi-token-prediction layers (``num_nextn_predict_layers``) are not part of the
  model transformers builds, so the shape has none; ``--mtp-layers`` prices training with
  them (:func:`shardlab.config.model.with_mtp`).

shardlab prices these shapes; its runtime does not build latent attention.
"""

from __future__ import annotations

from typing import Any, Protocol

from shardlab.config.limits import MAX_WIDTH
from shardlab.config.model import MLA, MoE
from shardlab.errors import SpecError, require_int_at_most


class Reader(Protocol):
    """What :mod:`shardlab.config.hf_config`'s reader offers: typed fields that name
    themselves in errors."""

    config: dict[str, Any]

    def positive_int(self, field: str, default: object = ...) -> int: ...


DEEPSEEK_FAMILIES: tuple[str, ...] = ("deepseek_v2", "deepseek_v3", "kimi_k2")
DEEPSEEK_ARCHITECTURES: dict[str, str] = {
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
}


_CONFIG_FIELDS = {"moe.groups": "n_group", "moe.group_topk": "topk_group"}
"""The config.json field behind each MoE field its own checks name."""


def deepseek_fields(r: Reader, heads: int) -> dict[str, Any]:
    """The ``mla`` and ``moe`` of a DeepSeek-family config (module docstring), and
    ``head_dim`` 0 (latent attention sets it)."""
    kv_heads = r.config.get("num_key_value_heads", heads)
    if kv_heads not in (None, heads):
        raise SpecError("num_key_value_heads", kv_heads, f"must equal num_attention_heads "
                        f"({heads}): latent attention gives every head its key and value")
    q_lora = 0 if r.config.get("q_lora_rank") is None else r.positive_int("q_lora_rank")
    widths = {f: r.positive_int(f) for f in ("kv_lora_rank", "qk_nope_head_dim",
                                              "qk_rope_head_dim", "v_head_dim")}
    for field, value in (*widths.items(), ("q_lora_rank", q_lora)):
        require_int_at_most(field, value, MAX_WIDTH)  # named as config.json names it
    mla = MLA(q_lora_rank=q_lora, **widths)
    layers = r.positive_int("num_hidden_layers")
    dense = r.config.get("first_k_dense_replace", 0)
    if isinstance(dense, bool) or not isinstance(dense, int) or not 0 <= dense <= layers:
        raise SpecError("first_k_dense_replace", dense,
                        f"must be an integer from 0 to num_hidden_layers ({layers})")
    if r.config.get("n_routed_experts") is None or dense == layers:
        # No routed experts (the modeling code's `is not None`), or no MoE layer: dense.
        return {"mla": mla, "moe": None, "head_dim": 0, "kv_heads": heads}
    freq = r.config.get("moe_layer_freq", 1)
    if isinstance(freq, bool) or freq != 1:
        raise SpecError("moe_layer_freq", r.config["moe_layer_freq"], "must be 1: every "
                        "layer past first_k_dense_replace is a MoE layer")
    experts = r.positive_int("n_routed_experts")
    top_k = r.positive_int("num_experts_per_tok")
    if top_k > experts:
        raise SpecError("num_experts_per_tok", top_k,
                        f"must be <= n_routed_experts ({experts})")
    shared = r.config.get("n_shared_experts")
    # Group-limited routing: n_group groups, topk_group chosen per token (null or absent: 1);
    # topk_method "greedy" takes the top k over all experts, ignoring the groups
    # (modeling_deepseek.py MoEGate), as V2-Lite does.
    n_group = 1 if r.config.get("n_group") is None else r.positive_int("n_group")
    topk_group = 1 if r.config.get("topk_group") is None else r.positive_int("topk_group")
    if r.config.get("topk_method") == "greedy":
        n_group = topk_group = 1
    try:
        moe = MoE(experts=experts, experts_per_token=top_k,
                  expert_d_ff=r.positive_int("moe_intermediate_size"),
                  shared_experts=0 if shared is None else r.positive_int("n_shared_experts"),
                  router_bias=r.config.get("topk_method") == "noaux_tc", dense_layers=dense,
                  groups=n_group, group_topk=topk_group)
    except SpecError as e:  # MoE's own rule, named as config.json names the field
        if e.field not in _CONFIG_FIELDS:
            raise
        raise SpecError(_CONFIG_FIELDS[e.field], e.value, e.allowed) from None
    return {"mla": mla, "moe": moe, "head_dim": 0, "kv_heads": heads}
