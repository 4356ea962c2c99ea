"""Mixtral's and Qwen3-MoE's mixture-of-experts weights <-> shardlab's router and grouped
experts.

shardlab (:class:`shardlab.nn.moe.MoEFeedForward`, block i): ``blocks.i.mlp.router.weight``
[E, d] and ``blocks.i.mlp.experts.{w_gate, w_up}`` [E, d, f], ``w_down`` [E, f, d] (x @ W).

Hugging Face checkpoints come in two layouts, both read:

* **per expert** (the published Mixtral checkpoints, transformers 4.x, and what
  transformers 5.x writes back on save): ``model.layers.i.block_sparse_moe.gate.weight``
  [E, d] and ``...block_sparse_moe.experts.e.{w1, w3, w2}.weight``, ``nn.Linear``
  weights of expert e's gate [f, d], up [f, d] and down [d, f]. Export writes this one:
  every transformers version loads it (5.x converts it on load, ``conversion_mapping.py``
  "mixtral": ``block_sparse_moe`` -> ``mlp``, w1 and w3 stacked and concatenated).
* **fused** (transformers 5.x's modules, ``MixtralExperts``): ``model.layers.i.mlp.gate.
  weight`` [E, d], ``...mlp.experts.gate_up_proj`` [E, 2f, d] (gate rows first, then up)
  and ``...mlp.experts.down_proj`` [E, d, f].

Both store ``out x in`` per expert, the transpose of shardlab's ``in x out``.

Qwen3-MoE (``Qwen3MoeForCausalLM``) names the same tensors ``mlp.gate.weight`` and
``mlp.experts.e.{gate_proj, up_proj, down_proj}.weight`` per expert (its published
checkpoints), and transformers 5.x's fused modules as Mixtral's; its router is Mixtral's
(softmax, top-k, renormalised) when ``norm_topk_prob`` is true, which import requires
(:func:`shardlab.config.hf_config.check_computable`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from shardlab.errors import SpecError

_PER_EXPERT = {"mixtral": ("block_sparse_moe.", (("w1", "w_gate"), ("w3", "w_up"),
                                                  ("w2", "w_down"))),
               "qwen3_moe": ("mlp.", (("gate_proj", "w_gate"), ("up_proj", "w_up"),
                                      ("down_proj", "w_down")))}
"""Per family: the MoE module's name in a block, and each expert matrix's name."""


def moe_to_hf(state: dict[str, torch.Tensor], layer: int, family: str = "mixtral"
              ) -> dict[str, torch.Tensor]:
    """Block ``layer``'s router and experts in ``family``'s per-expert names."""
    module, names = _PER_EXPERT[family]
    ours, theirs = f"blocks.{layer}.mlp.", f"model.layers.{layer}.{module}"
    out = {theirs + "gate.weight": state[ours + "router.weight"].clone()}
    for name, mine in names:
        grouped = state[ours + "experts." + mine]  # [E, in, out]
        for e in range(grouped.shape[0]):
            out[f"{theirs}experts.{e}.{name}.weight"] = grouped[e].t().contiguous()
    return out


def moe_from_hf(take: Callable[[str], torch.Tensor], present: Callable[[str], bool],
                layer: int, experts: int, family: str = "mixtral") -> dict[str, torch.Tensor]:
    """Block ``layer``'s router and experts in shardlab's names, from either layout.

    ``take(name)`` returns a checkpoint tensor (or raises SpecError naming it),
    ``present(name)`` says whether the checkpoint holds it.
    """
    h, ours = f"model.layers.{layer}.", f"blocks.{layer}.mlp."
    if present(h + "mlp.experts.gate_up_proj"):
        router = take(h + "mlp.gate.weight")
        gate, up = take(h + "mlp.experts.gate_up_proj").chunk(2, dim=1)  # [E, f, d] each
        down = take(h + "mlp.experts.down_proj")  # [E, d, f]
        grouped = {"w_gate": gate, "w_up": up, "w_down": down}
    else:
        module, names = _PER_EXPERT[family]
        router = take(h + module + "gate.weight")
        grouped = {mine: _stack([f"{h}{module}experts.{e}.{name}.weight"
                                 for e in range(experts)], take)
                   for name, mine in names}
    out = {ours + "router.weight": router}
    for mine, w in grouped.items():
        out[ours + "experts." + mine] = w.transpose(1, 2).contiguous()
    return out


def _stack(names: list[str], take: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """The experts' matrices as one [E, out, in] tensor; unequal sizes name the first."""
    tensors = [take(n) for n in names]
    for name, t in zip(names, tensors, strict=True):
        if t.shape != tensors[0].shape or t.dim() != 2:
            raise SpecError("weights", name, f"has size {list(t.shape)}, expert 0's "
                            f"{list(tensors[0].shape)}: every expert must be 2-D, one size")
    return torch.stack(tensors)
