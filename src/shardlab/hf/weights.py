"""shardlab weights <-> Hugging Face ``transformers`` layouts (LLaMA, Qwen2, Qwen3, Mixtral,
GPT-2).

shardlab's LM (:mod:`shardlab.nn.model`) computes what these transformers classes
compute, so export and import only rename and reshape tensors:

* **llama style -> ``LlamaForCausalLM``** (``Qwen2ForCausalLM`` when q/k/v carry biases,
  as Qwen2's attention hard-wires them). RMSNorm with eps 1e-6 (``rms_norm_eps``),
  SwiGLU with SiLU (``hidden_act: silu``), grouped-query attention, rotary positions
  with theta 10 000 (the shape's ``rope_theta``). ``Qwen3ForCausalLM`` when the shape has
  query/key norms: ``blocks.i.attn.{q,k}_norm -> ...self_attn.{q,k}_norm``, RMSNorms of
  ``head_dim`` applied per head before rotary, as shardlab's
  :func:`~shardlab.nn.model.head_norm`. The rotary convention is the same on both sides:
  shardlab rotates the pairs ``(i, i + head_dim/2)`` ("rotate half",
  :func:`shardlab.nn.model.apply_rope`), which is transformers' ``rotate_half``, so q/k
  weights are copied unpermuted. (Meta's
  original LLaMA weights rotate interleaved pairs ``(2i, 2i+1)``; transformers'
  ``convert_llama_weights_to_hf.py`` permutes q/k once into rotate-half, which is the
  form every Hugging Face LLaMA checkpoint has, and the form import expects.)
  Names: ``embed -> model.embed_tokens``, ``blocks.i.attn_norm -> model.layers.i.
  input_layernorm``, ``blocks.i.attn.{q,k,v,o}_proj -> ...self_attn.{q,k,v,o}_proj``,
  ``blocks.i.mlp_norm -> ...post_attention_layernorm``, ``blocks.i.mlp.{gate,up,down}_proj
  -> ...mlp.*``, ``final_norm -> model.norm``, ``lm_head -> lm_head`` (omitted when tied).
* **llama style with experts -> ``MixtralForCausalLM``** (``Qwen3MoeForCausalLM`` with
  query/key norms): the llama names for attention and norms, the router and experts as
  :mod:`shardlab.hf.mixtral` maps them (every layer MoE, no shared experts, no router
  bias: :func:`shardlab.config.hf_export.hf_family`).
* **gpt style -> ``GPT2LMHeadModel``**: LayerNorm eps 1e-5, GELU tanh approximation
  (``activation_function: gelu_pytorch_tanh``, the same ``F.gelu(approximate="tanh")``
  kernel shardlab calls), learned positions (``wte``, ``wpe``). GPT-2's ``Conv1D``
  stores weights ``[in, out]``, the transpose of ``nn.Linear``'s ``[out, in]``, and fuses
  q, k, v into one ``c_attn`` of ``[d, 3d]``: export concatenates ``[Wq; Wk; Wv]`` and
  transposes; import splits and transposes back. Multi-head only (GPT-2 has no GQA) and
  ``head_dim = d_model / heads``.

Files are read with ``safetensors`` only (a checkpoint is data, never code); import
refuses NaN/inf weights and what the model would compute differently
(:func:`shardlab.config.hf_config.check_computable`); export checks the manifest's shape
against the tensor sizes the checkpoint holds. Both write their folder all at once
(:mod:`shardlab.hf.folder`). Export
writes ``model.safetensors`` (or ``pytorch_model.bin`` with ``--format torch``, read back
by transformers with ``weights_only=True``) and ``config.json``
(:func:`shardlab.config.hf_export.hf_config`, which needs no torch).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from shardlab.config.hf_config import (
    check_computable,
    load_config,
    shape_from_hf_config,
)
from shardlab.config.hf_export import hf_config, hf_family
from shardlab.config.model import ModelShape, MoE
from shardlab.distributed import checkpoint_manifest
from shardlab.distributed.checkpoint import load_model_state
from shardlab.distributed.checkpoint_reader import safe_reader
from shardlab.errors import SpecError
from shardlab.hf.folder import OutputFolder
from shardlab.hf.mixtral import moe_from_hf, moe_to_hf
from shardlab.nn.model import TransformerLM

WEIGHTS, CONFIG, MARKER = "model.safetensors", "config.json", "shardlab-weights.json"
FORMATS = ("safetensors", "torch")


# --- names -----------------------------------------------------------------------------

_LLAMA_BLOCK = {"attn_norm.weight": "input_layernorm.weight",
                "mlp_norm.weight": "post_attention_layernorm.weight",
                **{f"attn.{p}_proj.{t}": f"self_attn.{p}_proj.{t}"
                   for p in "qkvo" for t in ("weight", "bias")},
                **{f"mlp.{p}_proj.weight": f"mlp.{p}_proj.weight"
                   for p in ("gate", "up", "down")},
                **{f"attn.{p}_norm.weight": f"self_attn.{p}_norm.weight" for p in "qk"}}
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
            if shape.moe is not None:
                out |= moe_to_hf(state, i, family)
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
        t = src[name]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise SpecError("weights", name, "holds NaN or infinite values (a diverged or "
                            "corrupt checkpoint): nothing imported")
        return t.to(torch.float32)

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
                if ours.startswith(("attn.q_norm", "attn.k_norm")) and not shape.qk_norm:
                    continue
                if not (shape.moe and ours.startswith("mlp.")):
                    out[b + ours] = take(name)
            if shape.moe is not None:
                out |= moe_from_hf(take, src.__contains__, i, shape.moe.experts, family)
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

# How safetensors reports a failed write: "... I/O error: No space left on device (os error 28)".
_IO_ERROR = re.compile(r"I/O error: (.*) \(os error (\d+)\)")


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path,
                      metadata: dict[str, str]) -> None:
    """``save_file``, with a failed write (a full disk) raised as the OSError it is: the
    Rust writer raises its own SafetensorError, which OutputFolder would not recognise."""
    try:
        # safetensors refuses tensors that share memory (a tied head): write distinct copies.
        save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()},
                  str(path), metadata=metadata)
    except SafetensorError as e:
        m = _IO_ERROR.search(str(e))
        if m is None:
            raise
        raise OSError(int(m.group(2)), m.group(1), str(path)) from e


def _is(path: Path, field: str, test: Callable[[Path], bool]) -> bool:
    """``test(path)``, with a name the system cannot look up (too long) a SpecError."""
    try:
        return test(path)
    except OSError as e:
        raise SpecError(field, str(path), f"cannot be read: {e.strerror or e}") from e


def _checkpoint_shape(folder: Path, doc: dict[str, Any]) -> ModelShape:
    """The shape the manifest records, checked against the tensor sizes DCP's metadata
    holds (a manifest edited and re-hashed must not reach DCP's 'Size mismatch')."""
    where = str(folder / checkpoint_manifest.MANIFEST)
    try:
        record = dict(doc["shape"])
        moe = record.pop("moe", None)
        shape = ModelShape(name=f"shardlab-step-{doc['step']}",
                           moe=MoE(**moe) if moe else None, **record)
    except (KeyError, TypeError, ValueError) as e:  # SpecError is a ValueError
        raise SpecError("checkpoint", where, f"its shape record is not a model shape "
                        f"({e})") from e
    hf_family(shape)  # refuse before reading tensors
    saved = {k.removeprefix("model."): tuple(getattr(m, "size", ()))
             for k, m in safe_reader(folder).read_metadata().state_dict_metadata.items()
             if k.startswith("model.")}
    blocks = {k.split(".")[1] for k in saved if k.startswith("blocks.")}
    # Compared first, so an edited layer count never builds a huge model below.
    if len(blocks) != shape.layers:
        raise SpecError("checkpoint", where, f"records layers={shape.layers} but holds "
                        f"{len(blocks)} blocks (manifest edited?)")
    with torch.device("meta"):  # shapes only: no memory for the weights
        expected = {k: tuple(t.shape) for k, t in TransformerLM(shape).state_dict().items()}
    for name, want in expected.items():
        got = saved.get(name)
        if got != want:
            held = "no such tensor" if got is None else f"{list(got)}"
            raise SpecError("checkpoint", where, f"its recorded shape makes {name} "
                            f"{list(want)}, the checkpoint holds {held} (manifest edited?)")
    return shape


def export(ckpt: str | os.PathLike[str], out_dir: str | os.PathLike[str],
           fmt: str = "safetensors") -> dict[str, Any]:
    """Consolidate a checkpoint folder (``step-N``) into a Hugging Face model folder.

    No process group: DCP reshards from the ranks that wrote it to one process. The
    folder is written all at once (:class:`~shardlab.hf.folder.OutputFolder`). Returns
    a summary (family, parameters, files, bytes).
    """
    if fmt not in FORMATS:
        raise SpecError("format", fmt, f"must be one of {', '.join(FORMATS)}")
    out = OutputFolder(out_dir)
    folder = Path(ckpt)
    if not _is(folder, "checkpoint", Path.is_dir):
        raise SpecError("checkpoint", str(folder), "does not exist")
    if (not (folder / checkpoint_manifest.MANIFEST).is_file()
            and checkpoint_manifest.complete_steps(folder)):
        folder = checkpoint_manifest.find(folder)  # a checkpoint root: its latest step
    doc = checkpoint_manifest.verify(folder)
    shape = _checkpoint_shape(folder, doc)
    state = load_model_state(folder, shape)
    tensors = to_hf(state, shape)
    config = hf_config(shape)
    name = WEIGHTS if fmt == "safetensors" else "pytorch_model.bin"
    with out as tmp:
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        if fmt == "safetensors":
            _save_safetensors(tensors, tmp / name, {"format": "pt"})
        else:
            # An open file, not a path: torch's own path writer reports a full disk as a
            # RuntimeError ("unexpected pos"), a Python file raises the OSError.
            with open(tmp / name, "wb") as f:
                torch.save({k: v.contiguous() for k, v in tensors.items()}, f)
        size = (tmp / name).stat().st_size
    return {"checkpoint": str(folder), "step": doc["step"], "family": hf_family(shape),
            "architecture": config["architectures"][0], "out_dir": out.shown,
            "files": [CONFIG, name], "tensors": len(tensors),
            "parameters": sum(t.numel() for k, t in state.items()
                              if not (shape.tied and k == "lm_head.weight")),
            "bytes": size}


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


def import_hf(hf_dir: str | os.PathLike[str],
              out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A Hugging Face folder (config.json + safetensors) as shardlab initial weights:
    ``out_dir/model.safetensors`` in TransformerLM names beside the ``config.json``
    (the shape ``shardlab train --init-from`` builds), checked by building the model.
    What the model would compute differently (rotary scaling or base, activation) and
    non-finite weights are refused; the folder is written all at once
    (:class:`~shardlab.hf.folder.OutputFolder`)."""
    folder = Path(hf_dir)
    if not _is(folder / CONFIG, "hf_dir", Path.is_file):
        raise SpecError("hf_dir", str(folder), f"has no {CONFIG}")
    shape = shape_from_hf_config(folder / CONFIG)
    config = load_config(folder / CONFIG)
    notes = check_computable(config, shape.style)
    out = OutputFolder(out_dir)
    state = from_hf(_read_hf_tensors(folder), shape)
    model = TransformerLM(shape)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise SpecError("weights", str(folder), f"do not fit the shape of {CONFIG}: "
                        f"{str(e).splitlines()[-1].strip()}") from e
    with out as tmp:
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        _save_safetensors(dict(model.state_dict()), tmp / WEIGHTS, {"format": "pt"})
        (tmp / MARKER).write_text(json.dumps({"source": str(folder), "shape": shape.describe(),
                                              "notes": notes}, indent=1) + "\n")
    return {"hf_dir": str(folder), "out_dir": out.shown, "model": shape.describe(),
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
