"""Published runs that state a measured peak memory per GPU but no step time to validate.

They check :mod:`shardlab.plan.published_memory` only (``measured_step`` is NaN; they are
not in :data:`shardlab.plan.published.RUNS`, whose every run has a step time).
Megatron-LM's own memory-and-speed tests state both and live in
:mod:`shardlab.plan.runs_functional`.

* MBQ: NVIDIA-NeMo/Megatron-Bridge ``skills/nemo-mbridge-perf-moe-hardware-configs``
  (commit 067f987d): Qwen3-30B-A3B on 16 H100, "Rank-0 peak allocated memory: 62.166
  GiB", recipe ``qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config``.
"""

from __future__ import annotations

from shardlab.plan.published_run import PublishedRun
from shardlab.plan.runs_nvidia import QWEN3_30B

MEMORY_ONLY_RUNS: tuple[PublishedRun, ...] = (
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
