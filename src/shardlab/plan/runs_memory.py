"""Published runs that state a measured peak memory per GPU but no step time to validate.

They check :mod:`shardlab.plan.published_memory` only (``measured_step`` is NaN; they are
not in :data:`shardlab.plan.published.RUNS`, whose every run has a step time).

* MLM: NVIDIA/Megatron-LM functional tests ``tests/functional_tests/test_cases/gpt/
  gpt3_7b_tp1_pp4_memory_speed`` and ``gpt3_7b_tp4_pp1_memory_speed`` (commit d98e8a64):
  ``model_config.yaml`` states the model and layout, ``golden_values_dev_dgx_h100.json``
  the ``mem-max-allocated-bytes`` of every iteration, logged by the last rank
  (``allocated_bytes.all.peak``; iteration 1 reads lower, before Adam's state exists).
  The H100 recipe runs each on one node of 8 GPUs.
* MBQ: NVIDIA-NeMo/Megatron-Bridge ``skills/nemo-mbridge-perf-moe-hardware-configs``
  (commit 067f987d): Qwen3-30B-A3B on 16 H100, "Rank-0 peak allocated memory: 62.166
  GiB", recipe ``qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config``.
"""

from __future__ import annotations

from shardlab.config.model import ModelShape
from shardlab.plan.published_run import PublishedRun
from shardlab.plan.runs_nvidia import QWEN3_30B

_MLM_SOURCE = "Megatron-LM functional test (memory_speed), DGX H100 golden values"


def _mlm_7b(vocab: int) -> ModelShape:
    # No --swiglu, --ffn-hidden-size, --normalization or --position-embedding-type: GeLU with
    # 4h, LayerNorm, learned positions, biases; dropout 0.1 (Megatron's defaults).
    return ModelShape("megatron-7b-gqa8", 32, 4096, 32, vocab=vocab, context=8192, kv_heads=8,
                      style="gpt", tied=False, source="model_config.yaml: --num-layers 32 "
                      "--hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 "
                      "--untie-embeddings-and-output-weights --vocab-size 131073 (padded to a "
                      "multiple of 128 x tp)")


def _mlm(key: str, tp: int, pp: int, virtual: int, mbs: int, memory: float, test: str
         ) -> PublishedRun:
    vocab = -(-131073 // (128 * tp)) * 128 * tp
    return PublishedRun(
        f"MLM {key}", _MLM_SOURCE, _mlm_7b(vocab), "H100 SXM", 8, tp, pp, 8, 8192,
        float("nan"), "validation", "memory only", recompute="none", zero=1,
        micro_batch=mbs, virtual=virtual, flash=True,
        options="overlap_dp=1", measured_memory_gib=memory, memory_figure="allocated",
        assumed=("the last rank's figure compared with the planner's busiest rank",),
        checked=f"tests/functional_tests/test_cases/gpt/{test}: model_config.yaml (--micro-"
        "batch-size, --global-batch-size 8, --seq-length 8192, --tensor-/--pipeline-model-"
        "parallel-size, --use-distributed-optimizer, --overlap-grad-reduce, --bf16, "
        "--transformer-impl transformer_engine, no --recompute-*, no --sequence-parallel) "
        "and golden_values_dev_dgx_h100.json mem-max-allocated-bytes from iteration 2")


MEMORY_ONLY_RUNS: tuple[PublishedRun, ...] = (
    _mlm("7B TP1 PP4 VPP8", 1, 4, 8, 1, 56.551, "gpt3_7b_tp1_pp4_memory_speed"),
    _mlm("7B TP4", 4, 1, 1, 2, 53.219, "gpt3_7b_tp4_pp1_memory_speed"),
    PublishedRun(
        "MBQ Qwen3-30B-A3B EP16", "Megatron-Bridge perf skill, Qwen3-30B-A3B on 16 H100",
        QWEN3_30B, "H100 SXM", 16, 1, 1, 1024, 4096, float("nan"), "validation",
        "memory only", recompute="none", zero=1, flash=True, ep=16, etp=1,
        capacity_factor=0.0, options="overlap_dp=1", measured_memory_gib=62.166,
        memory_figure="allocated",
        assumed=("balanced routing (the perf variant forces it)",
                 "rank 0 compared with the planner's busiest rank (all ranks alike)"),
        checked="skills/nemo-mbridge-perf-moe-hardware-configs/SKILL.md: 'Qwen3 30B-A3B on "
        "16 H100 ... TP=1 EP=16 PP=1 CP=1 ... BF16 ... Sequence: 4096 ... MBS1 GBS1024 ... "
        "Rank-0 peak allocated memory: 62.166 GiB'; the recipe: recompute None, ETP 1, "
        "distributed optimizer with fp32 main params, grads and moments"),
)
