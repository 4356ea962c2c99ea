"""Megatron-LM's own memory-and-speed functional tests: a measured step and peak per GPU.

MLM: NVIDIA/Megatron-LM ``tests/functional_tests/test_cases/gpt/gpt3_7b_tp1_pp4_memory_speed``
and ``gpt3_7b_tp4_pp1_memory_speed`` (before October 2025 ``gpt3_7b_mr_dgx_a100_1N8G_*``,
the same files): ``model_config.yaml`` states the model and layout; each platform's
``golden_values_dev_<platform>.json`` logs ``iteration-time`` every second iteration and
``mem-max-allocated-bytes`` (``allocated_bytes.all.peak``, logged by the last rank;
iteration 1 reads lower, before Adam's state exists). The recipes run each on 8 GPUs:
one DGX H100 or DGX A100 node (``recipes/h100/gpt.yaml``, the 2025 ``recipes/gpt.yaml``:
``nodes: 1, gpus: 8``), two 4-GPU GB200 trays of one NVL72 domain (``recipes/gb200/
gpt.yaml``: ``nodes: 2, gpus: 4``). Files as read at Megatron-LM d98e8a64 (2026-08-22)
and the commits each run names.

**Excluded from the step-time headline, kept for memory**: every one of these tests runs
``--deterministic-mode`` with ``NVTE_ALLOW_NONDETERMINISTIC_ALGO: 0`` (Transformer
Engine's deterministic attention backward) and ``NCCL_ALGO: Ring``, kernels chosen for
reproducible bits, not speed, which the planner has no way to state or price. Their
memory peaks are held-out rows of :mod:`shardlab.plan.published_memory`.
"""

from __future__ import annotations

from shardlab.config.model import ModelShape
from shardlab.plan.published_run import PublishedRun

_SRC = "Megatron-LM functional test (memory_speed)"
_DETERMINISTIC = ("deterministic mode (--deterministic-mode, NVTE_ALLOW_NONDETERMINISTIC_ALGO "
                  "0, NCCL_ALGO Ring): deterministic kernels the planner does not price; "
                  "the memory peak is held out")
_GIB = 2.0**30


def _mlm_7b(vocab: int) -> ModelShape:
    # No --swiglu, --ffn-hidden-size, --normalization or --position-embedding-type: GeLU with
    # 4h, LayerNorm, learned positions, biases; dropout 0.1 (Megatron's defaults).
    return ModelShape("megatron-7b-gqa8", 32, 4096, 32, vocab=vocab, context=8192, kv_heads=8,
                      style="gpt", tied=False, source="model_config.yaml: --num-layers 32 "
                      "--hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 "
                      "--untie-embeddings-and-output-weights --vocab-size 131072 (NullTokenizer "
                      "adds one: 131073, padded to a multiple of 128 x tp)")


def _mlm(key: str, gpu: str, tp: int, pp: int, virtual: int, mbs: int, step: float,
         peak_bytes: float, golden: str, times: str, test: str) -> PublishedRun:
    vocab = -(-131073 // (128 * tp)) * 128 * tp
    return PublishedRun(
        f"MLM {key}", f"{_SRC}, {golden}", _mlm_7b(vocab), gpu, 8, tp, pp, 8, 8192, step,
        "validation", f"iteration-time {step} s (median of {times})", recompute="none",
        zero=1, micro_batch=mbs, virtual=virtual, flash=True,
        options="overlap_dp=1 fused_accumulation=0", excluded=_DETERMINISTIC,
        measured_memory_gib=peak_bytes / _GIB, memory_figure="allocated",
        assumed=("the last rank's memory figure compared with the planner's busiest rank",
                 "Transformer Engine's fused attention (the default backend)"),
        checked=f"tests/functional_tests/test_cases/gpt/{test}: model_config.yaml "
        "(--micro-batch-size, --global-batch-size 8, --seq-length 8192, --tensor-/--pipeline-"
        "model-parallel-size, --use-distributed-optimizer, --overlap-grad-reduce, "
        "--overlap-param-gather, --no-gradient-accumulation-fusion, --bf16, "
        "--transformer-impl transformer_engine, no --recompute-*, no --sequence-parallel) "
        f"and {golden}: iteration-time and mem-max-allocated-bytes {peak_bytes:.0f}")


_PP4 = "gpt3_7b_tp1_pp4_memory_speed"
_TP4 = "gpt3_7b_tp4_pp1_memory_speed"

FUNCTIONAL_RUNS: tuple[PublishedRun, ...] = (
    _mlm("7B TP1 PP4 VPP8", "H100 SXM", 1, 4, 8, 1, 1.150, 60720852992,
         "golden_values_dev_dgx_h100.json (fd7a326c @ 6e091e1b)", "1.14861-1.16377, steps "
         "4-24", _PP4),
    _mlm("7B TP4", "H100 SXM", 4, 1, 1, 2, 1.115, 57143791616,
         "golden_values_dev_dgx_h100.json (6e514878 @ 6e091e1b)", "1.11139-1.12221, steps "
         "4-24", _TP4),
    _mlm("7B TP1 PP4 VPP8 A100", "A100 SXM 80GB", 1, 4, 8, 1, 2.942, 60489064448,
         "golden_values_dev_dgx_a100.json (074fa6ff @ 2795ebde)", "2.9368 and 2.94791, "
         "steps 10 and 20", _PP4),
    _mlm("7B TP4 A100", "A100 SXM 80GB", 4, 1, 1, 2, 2.587, 58188115968,
         "golden_values_dev_dgx_a100.json (295a8209 @ 2795ebde)", "2.57769 and 2.596, steps "
         "10 and 20", _TP4),
    _mlm("7B TP1 PP4 VPP8 GB200", "GB200", 1, 4, 8, 1, 0.787, 60519342080,
         "golden_values_dev_dgx_gb200.json (ec514555 @ 7e6a045a)", "0.7843-1.00358, steps "
         "4-24", _PP4),
    _mlm("7B TP4 GB200", "GB200", 4, 1, 1, 2, 0.853, 58217476096,
         "golden_values_dev_dgx_gb200.json (cdf05080 @ 7e6a045a)", "0.85029-1.10296, steps "
         "4-24", _TP4),
)
