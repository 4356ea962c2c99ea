"""``shardlab import``: a Hugging Face folder as initial weights for ``shardlab train``."""

from __future__ import annotations

import argparse
from typing import Any

from shardlab.cli.output import print_json


def register(sub: Any) -> None:
    """Add the ``import`` sub-command."""
    p = sub.add_parser("import", help="Hugging Face weights as initial weights for train",
                       description="Read a Hugging Face folder (config.json and safetensors: "
                       "llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gpt2 families, or "
                       "what `shardlab export` wrote) and write it in shardlab's parameter "
                       "names, for `shardlab train --init-from OUT_DIR`. Refused: what "
                       "shardlab's model "
                       "would compute differently (a rotary base other than 10000, rope "
                       "scaling, another activation, a Mixtral sliding window or router "
                       "jitter, a Qwen3-MoE router that does not renormalise its top-k "
                       "weights) and NaN or infinite weights.")
    p.add_argument("hf_dir", help="folder with config.json and *.safetensors")
    p.add_argument("out_dir", help="a new or empty folder in an existing one; written all "
                   "at once (a failure leaves nothing there)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Map the names, check the shapes by loading the model, write the folder."""
    # Imported here: it loads torch, which the torch-free commands (budget, plan) must not.
    from shardlab.hf.weights import import_hf

    doc = import_hf(args.hf_dir, args.out_dir)
    if args.json:
        print_json(doc)
    else:
        print(f"{doc['hf_dir']} -> {doc['out_dir']}: {doc['model']}, "
              f"{doc['parameters']:,} parameters; train with "
              f"`shardlab train --init-from {doc['out_dir']}`")
        for note in doc["notes"]:
            print(f"note: {note}")
    return 0
