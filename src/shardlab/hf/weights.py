"""shardlab weights <-> Hugging Face ``transformers`` layouts (LLaMA, Qwen2, GPT-2).

shardlab's LM (:mod:`shardlab.nn.model`) computes what these transformers classes
compute, so export and import only rename and reshape tensors:

* **llama style -> ``LlamaForCausalLM``** (``Qwen2ForCausalLM`` when q/k/v carry biases,
  as Qwen2's attention hard-wires them). RMSNorm with eps 1e-6 (``rms_norm_eps``),
  SwiGLU with SiLU (``hidden_act: silu``), grouped-query attention, rotary positions
  with theta 10 000. The rotary convention is the same on both sides: shardlab rotates
  the pairs ``(i, i + head_dim/2)`` ("rotate half", :func:`shardlab.nn.model.apply_rope`),
  which is transformers' ``rotate_half``, so q/k weights are copied unpermuted. (Meta's
  original LLaMA weights rotate interleaved pairs ``(2i, 2i+1)``; transformers'
  ``convert_llama_weights_to_hf.py`` permutes q/k once into rotate-half, which is the
  form every Hugging Face LLaMA checkpoint has, and the form import expects.)
  Names: ``embed -> model.embed_tokens``, ``blocks.i.attn_norm -> model.layers.i.
  input_layernorm``, ``blocks.i.attn.{q,k,v,o}_proj -> ...self_attn.{q,k,v,o}_proj``,
  ``blocks.i.mlp_norm -> ...post_attention_layernorm``, ``blocks.i.mlp.{gate,up,down}_proj
  -> ...mlp.*``, ``final_norm -> model.norm``, ``lm_head -> lm_head`` (omitted when tied).
* **gpt style -> ``GPT2LMHeadModel``**: LayerNorm eps 1e-5, GELU tanh approximation
  (``activation_function: gelu_pytorch_tanh``, the same ``F.gelu(approximate="tanh")``
  kernel shardlab calls), learned positions (``wte``, ``wpe``). GPT-2's ``Conv1D``
  stores weights ``[in, out]``, the transpose of ``nn.Linear``'s ``[out, in]``, and fuses
  q, k, v into one ``c_attn`` of ``[d, 3d]``: export concatenates ``[Wq; Wk; Wv]`` and
  transposes; import splits and transposes back. Multi-head only (GPT-2 has no GQA) and
  ``head_dim = d_model / heads``.

Files are read with ``safetensors`` only (a checkpoint is data, never code); export
writes ``model.safetensors`` (or ``pytorch_model.bin`` with ``--format torch``, read back
by transformers with ``weights_only=True``) and ``config.json``
(:func:`shardlab.config.hf_config.hf_config`, which needs no torch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from shardlab.config.hf_config import hf_config, hf_family, shape_from_hf_config
from shardlab.config.model import LN_EPS, RMS_EPS, ROPE_THETA, ModelShape, MoE
from shardlab.distributed import checkpoint_manifest
from shardlab.distributed.checkpoint import load_model_state
from shardlab.errors import SpecError
from shardlab.nn.model import TransformerLM

WEIGHTS, CONFIG, MARKER = "model.safetensors", "config.json", "shardlab-weights.json"
FORMATS = ("safetensors", "torch")


# --- names -----------------------------------------------------------------------------

_LLAMA_BLOCK = {"attn_norm.weight": "input_layernorm.weight",
                "mlp_norm.weight": "post_attention_layernorm.weight",
                **{f"attn.{p}_proj.{t}": f"self_attn.{p}_proj.{t}"
                   for p in "qkvo" for t in ("weight", "bias")},
                **{f"mlp.{p}_proj.weight": f"mlp.{p}_proj.weight"
                   for p in ("gate", "up", "down")}}
_GPT_BLOCK = {f"{ours}.{t}": f"{theirs}.{t}" for t in ("weight", "bias")
              for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2"),
                                   ("attn.o_proj", "attn.c_proj"), ("mlp.up_proj", "mlp.c_fc"),
                                   ("mlp.down_proj", "mlp.c_proj"))}


def to_hf(state: dict[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """shardlab's state dict (TransformerLM names) in the exported family's names."""
    family = hf_family(shape)
    out: dict[str, torch.Tensor] = {}
    for i in range(shape.layers):
        b = f"blocks.{i}."
        if family == "gpt2":
            h = f"transformer.h.{i}."
            for ours, theirs in _GPT_BLOCK.items():
                t = state[b + ours]
                out[h + theirs] = t.t().contiguous() if t.dim() == 2 else t.clone()
            qkv = [state[f"{b}attn.{p}_proj.weight"] for p in "qkv"]
            out[h + "attn.c_attn.weight"] = torch.cat(qkv, 0).t().contiguous()
            out[h + "attn.c_attn.bias"] = torch.cat(
                [state[f"{b}attn.{p}_proj.bias"] for p in "qkv"], 0)
        else:
            for ours, theirs in _LLAMA_BLOCK.items():
                if b + ours in state:
                    out[f"model.layers.{i}.{theirs}"] = state[b + ours].clone()
    if family == "gpt2":
        out |= {"transformer.wte.weight": state["embed.weight"].clone(),
                "transformer.wpe.weight": state["pos.weight"].clone(),
                "transformer.ln_f.weight": state["final_norm.weight"].clone(),
                "transformer.ln_f.bias": state["final_norm.bias"].clone()}
    else:
        out |= {"model.embed_tokens.weight": state["embed.weight"].clone(),
                "model.norm.weight": state["final_norm.weight"].clone()}
    if not shape.tied:
        out["lm_head.weight"] = state["lm_head.weight"].clone()
    return out


def from_hf(tensors: dict[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_hf`: a Hugging Face state dict in TransformerLM names.

    Accepts the prefixes real checkpoints use or omit (``model.``, ``transformer.``) and
    skips non-parameter buffers (``rotary_emb.inv_freq``, GPT-2's ``attn.bias`` masks).
    """
    family = hf_family(shape)
    prefix = "transformer." if family == "gpt2" else "model."
    src = {(k if k.startswith(prefix) or k == "lm_head.weight" else prefix + k): v
           for k, v in tensors.items()}

    def take(name: str) -> torch.Tensor:
        if name not in src:
            raise SpecError("weights", name, "is missing from the Hugging Face checkpoint")
        return src[name].to(torch.float32)

    out: dict[str, torch.Tensor] = {}
    for i in range(shape.layers):
        b = f"blocks.{i}."
        if family == "gpt2":
            h = f"transformer.h.{i}."
            for ours, theirs in _GPT_BLOCK.items():
                t = take(h + theirs)
                out[b + ours] = t.t().contiguous() if t.dim() == 2 else t
            w, bias = take(h + "attn.c_attn.weight").t(), take(h + "attn.c_attn.bias")
            for p, wp, bp in zip("qkv", w.chunk(3, 0), bias.chunk(3, 0), strict=True):
                out[f"{b}attn.{p}_proj.weight"] = wp.contiguous()
                out[f"{b}attn.{p}_proj.bias"] = bp.contiguous()
        else:
            for ours, theirs in _LLAMA_BLOCK.items():
                name = f"model.layers.{i}.{theirs}"
                if ours.endswith("bias"):
                    if name in src and shape.qkv_bias and not ours.startswith("attn.o"):
                        out[b + ours] = take(name)
                    continue
                out[b + ours] = take(name)
    if family == "gpt2":
        out |= {"embed.weight": take("transformer.wte.weight"),
                "pos.weight": take("transformer.wpe.weight"),
                "final_norm.weight": take("transformer.ln_f.weight"),
                "final_norm.bias": take("transformer.ln_f.bias")}
    else:
        out |= {"embed.weight": take("model.embed_tokens.weight"),
                "final_norm.weight": take("model.norm.weight")}
    out["lm_head.weight"] = (out["embed.weight"] if shape.tied or "lm_head.weight" not in src
                             else take("lm_head.weight"))
    return out


# --- files -----------------------------------------------------------------------------

def _empty_target(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SpecError("out_dir", str(out), "exists and is not empty (nothing is "
                        "overwritten)")


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path,
                      metadata: dict[str, str]) -> None:
    # safetensors refuses tensors that share memory (a tied head): write distinct copies.
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, str(path),
              metadata=metadata)


def export(ckpt: str | os.PathLike[str], out_dir: str | os.PathLike[str],
           fmt: str = "safetensors") -> dict[str, Any]:
    """Consolidate a checkpoint folder (``step-N``) into a Hugging Face model folder.

    No process group: DCP reshards from the ranks that wrote it to one process. Returns
    a summary (family, parameters, files, bytes).
    """
    if fmt not in FORMATS:
        raise SpecError("format", fmt, f"must be one of {', '.join(FORMATS)}")
    out = Path(out_dir)
    _empty_target(out)
    folder = Path(ckpt)
    if not folder.is_dir():
        raise SpecError("checkpoint", str(folder), "does not exist")
    if (not (folder / checkpoint_manifest.MANIFEST).is_file()
            and checkpoint_manifest.complete_steps(folder)):
        folder = checkpoint_manifest.find(folder)  # a checkpoint root: its latest step
    doc = checkpoint_manifest.verify(folder)
    record = dict(doc["shape"])
    moe = record.pop("moe")
    shape = ModelShape(name=f"shardlab-step-{doc['step']}",
                       moe=MoE(**moe) if moe else None, **record)
    hf_family(shape)  # refuse before writing anything
    state = load_model_state(folder, shape)
    tensors = to_hf(state, shape)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(shape)
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    if fmt == "safetensors":
        _save_safetensors(tensors, out / WEIGHTS, {"format": "pt"})
        name = WEIGHTS
    else:
        name = "pytorch_model.bin"
        torch.save({k: v.contiguous() for k, v in tensors.items()}, out / name)
    return {"checkpoint": str(folder), "step": doc["step"], "family": hf_family(shape),
            "architecture": config["architectures"][0], "out_dir": str(out),
            "files": [CONFIG, name], "tensors": len(tensors),
            "parameters": sum(t.numel() for k, t in state.items()
                              if not (shape.tied and k == "lm_head.weight")),
            "bytes": (out / name).stat().st_size}


def _read_hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face folder's safetensors files (one, or sharded)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SpecError("hf_dir", str(folder), "holds no *.safetensors file (shardlab "
                        "reads safetensors only: a pickle can run code)")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors |= load_file(str(f))
        except (SafetensorError, OSError) as e:
            raise SpecError("hf_dir", str(f), f"is not a readable safetensors file ({e})") from e
    return tensors


def _check_rope(config: dict[str, Any]) -> None:
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta", ROPE_THETA))
    kind = params.get("rope_type") or (config.get("rope_scaling") or {}).get("rope_type")
    if float(theta) != ROPE_THETA:
        raise SpecError("rope_theta", theta, f"must be {ROPE_THETA:g}: shardlab's model "
                        "has a fixed rotary base")
    if kind not in (None, "default"):
        raise SpecError("rope_scaling", kind, "is not supported (shardlab's rotary "
                        "positions are unscaled)")


def import_hf(hf_dir: str | os.PathLike[str],
              out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A Hugging Face folder (config.json + safetensors) as shardlab initial weights:
    ``out_dir/model.safetensors`` in TransformerLM names beside the ``config.json``
    (the shape ``shardlab train --init-from`` builds), checked by building the model."""
    folder, out = Path(hf_dir), Path(out_dir)
    if not (folder / CONFIG).is_file():
        raise SpecError("hf_dir", str(folder), f"has no {CONFIG}")
    _empty_target(out)
    shape = shape_from_hf_config(folder / CONFIG)
    config = json.loads((folder / CONFIG).read_text(encoding="utf-8-sig"))
    if shape.style == "llama":
        _check_rope(config)
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise SpecError("hidden_act", act, "must be silu (SwiGLU)")
    notes = []
    eps = config.get("rms_norm_eps" if shape.style == "llama" else "layer_norm_epsilon")
    ours = RMS_EPS if shape.style == "llama" else LN_EPS
    if eps is not None and float(eps) != ours:
        notes.append(f"norm eps {eps} in config.json, shardlab's model uses {ours:g}: "
                     "logits differ slightly")
    state = from_hf(_read_hf_tensors(folder), shape)
    model = TransformerLM(shape)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise SpecError("weights", str(folder), f"do not fit the shape of {CONFIG}: "
                        f"{str(e).splitlines()[-1].strip()}") from e
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    _save_safetensors(dict(model.state_dict()), out / WEIGHTS, {"format": "pt"})
    (out / MARKER).write_text(json.dumps({"source": str(folder), "shape": shape.describe(),
                                          "notes": notes}, indent=1) + "\n")
    return {"hf_dir": str(folder), "out_dir": str(out), "model": shape.describe(),
            "parameters": sum(p.numel() for p in model.parameters()),
            "files": [CONFIG, WEIGHTS, MARKER], "notes": notes}


def read_weights(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The tensors of ``shardlab import``'s output (a folder or its model.safetensors)."""
    p = Path(path)
    if p.is_dir():
        if not (p / MARKER).is_file():
            raise SpecError("init_from", str(p), "is not a folder `shardlab import` wrote "
                            f"(no {MARKER}); import a Hugging Face folder first")
        p = p / WEIGHTS
    try:
        return load_file(str(p))
    except (SafetensorError, OSError) as e:
        raise SpecError("init_from", str(p), f"is not a readable safetensors file ({e})") from e
