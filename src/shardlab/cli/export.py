"""``shardlab export``: a training checkpoint as a Hugging Face model folder."""

from __future__ import annotations

import argparse
from typing import Any

from shardlab.cli.output import print_json


def register(sub: Any) -> None:
    """Add the ``export`` sub-command."""
    p = sub.add_parser("export", help="a checkpoint as Hugging Face weights + config.json",
                       description="Consolidate a `shardlab train` checkpoint (any layout, "
                       "no process group) into a folder transformers loads: LLaMA-style "
                       "shapes as LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases, "
                       "Qwen3ForCausalLM with query/key norms), GPT-style as "
                       "GPT2LMHeadModel, mixture-of-experts shapes as MixtralForCausalLM "
                       "(Qwen3MoeForCausalLM with query/key norms; every layer MoE, no "
                       "shared experts, no router bias).")
    p.add_argument("checkpoint", help="a step-N folder, or a --checkpoint-dir (its latest)")
    p.add_argument("out_dir", help="a new or empty folder in an existing one; written all "
                   "at once (a failure leaves nothing there)")
    # shardlab.hf.weights.FORMATS, not imported here: registering a command must not import torch
    p.add_argument("--format", choices=("safetensors", "torch"), default="safetensors",
                   help="model.safetensors (default) or pytorch_model.bin")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Verify the checkpoint, reshard it to one process, write the folder."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.hf.weights import export

    doc = export(args.checkpoint, args.out_dir, args.format)
    if args.json:
        print_json(doc)
    else:
        print(f"{doc['checkpoint']} (step {doc['step']}) -> {doc['out_dir']}: "
              f"{doc['architecture']}, {doc['parameters']:,} parameters, "
              f"{', '.join(doc['files'])} ({doc['bytes']:,} bytes of weights)")
    return 0
