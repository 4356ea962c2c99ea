"""The largest inputs shardlab takes: past these a number is a typo, not a plan.

Each limit is far above any published model or cluster (the largest catalog entry,
Llama 3.1 405B, has 126 layers, d_model 16,384, d_ff 53,248, a 128K vocabulary and
131,072 tokens of context; the largest published training runs use tens of thousands
of GPUs) and low enough that every figure stays an exact integer or a float with its
full precision, and a search or a budget ends in seconds. A value over one is a
:class:`~shardlab.errors.SpecError` naming the field and the limit (exit code 2).
"""

from __future__ import annotations

MAX_GPUS = 2**20
"""Devices in one job (1,048,576): ``--gpus``, ``--gpus-per-node``, ``--max-tp``,
``--max-pp`` and each of dp, tp, pp."""

MAX_LAYERS = 4096
"""Transformer layers of a model; also the most model chunks per pipeline rank
(``--max-virtual``, ``virtual_stages``), which can never exceed the layers."""

MAX_WIDTH = 2**20
"""d_model, and head_dim, in elements (1,048,576; the largest published is 16,384+)."""

MAX_FF = 2**22
"""d_ff and the MoE experts' widths, in elements (4,194,304)."""

MAX_HEADS = 2**16
"""Attention heads (and kv heads) per layer (65,536)."""

MAX_VOCAB = 2**24
"""Vocabulary size in tokens (16,777,216; the largest published is about 256K)."""

MAX_CONTEXT = 2**24
"""Tokens per sequence: a model's context, ``--seq`` (16,777,216, above the 10M-token
contexts published)."""

MAX_EXPERTS = 2**16
"""Routed or shared experts of a MoE layer (65,536)."""

MAX_BATCH = 2**24
"""Sequences per optimizer step or per micro-batch (16,777,216)."""

MAX_PARAMS = 2**53
"""A bare parameter count (``budget --params``): about 9.0e15, the largest integer a
float64 holds exactly (the largest published model has about 2e12)."""

MAX_CANDIDATES = 2_000_000
"""Layouts one ``plan`` search evaluates, counted before any is built: a few hundred bytes
each through the cost model (the memory tables go in blocks, :mod:`shardlab.plan.memory`),
so a search stays under about 1 GB and some seconds. The default space (8 devices per
node, the even pipeline split) stays below it on up to 2^20 devices (at most 1.57 million
layouts, 4,096 layers on 997,920 devices, with context parallel and HSDP); the uneven
splits are left out, with a note, where they would pass it."""

MAX_FILE_BYTES = 2**20
"""Bytes of a file read as input (a model's config.json, a ``--hardware-file``): 1 MiB,
hundreds of times a real one, so a wrong path (``/dev/zero``, a checkpoint) is refused
before it is read."""
