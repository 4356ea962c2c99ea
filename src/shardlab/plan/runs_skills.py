"""Measured runs that Megatron-Bridge's performance skills publish (H100).

* MSK: NVIDIA-NeMo/Megatron-Bridge ``skills/nemo-mbridge-perf-expert-parallel-overlap/
  SKILL.md`` (added by 7ded17dae, "perf(recipe): overlap Qwen3 expert communication on
  H100", 25 July 2026; the section the same at HEAD 067f987df, 415e90afd only appending a
  signature line), section "HybridEP Production-Shape Benchmark": Qwen3-30B-A3B
  pre-training on 16 H100 in bf16, one
  controlled comparison in which only the expert-parallel overlap changes. Its step times
  are printed to the ten-thousandth of a second over stated steady windows. The skill's
  other table (an "alltoall" SFT run at 41.25 s) states no sequence length and is not used.

The selection rule is the one of the other tables: every row that states its layout, batch,
sequence and precision and whose settings the planner prices; both rows of the section
were recorded before either was priced.
"""

from __future__ import annotations

from shardlab.plan.published_run import PublishedRun
from shardlab.plan.runs_nvidia import DGX_H100, QWEN3_30B

_SKILL = ("Megatron-Bridge skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md "
          "(7ded17dae, 2026-07-25), HybridEP production-shape benchmark")
_SETUP = ("its setup block: 'Hardware: 16×H100', 'Precision: BF16', 'Sequence: 4096', "
          "'Parallelism: TP1 / PP1 / CP1 / EP16', 'Batch: MBS1 / GBS1024', 'Routing: force "
          "balance', 'Dispatcher: flex + HybridEP', 'CUDA graph: Transformer Engine scopes "
          "moe_router + moe_preprocess', 'Delayed wgrad: disabled'; the recipe it tunes, "
          "recipes/qwen/h100/qwen3_moe.py qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config at "
          "7ded17dae: distributed optimizer with fp32 main grads, parameters and moments, "
          "ddp overlap_grad_reduce and overlap_param_gather, grad_reduce_in_fp32 False, no "
          "recompute, sequence_parallel False, moe_grouped_gemm, moe_permute_fusion, "
          "moe_router_fusion, moe_hybridep_num_sms 32; perf_recipes _benchmark_common: "
          "cross_entropy_fusion_impl te")
_ASSUMED = ("HybridEP (NVLink within a node, RDMA across the two) priced as DeepEP's "
            "internode dispatch: each token once per remote node holding one of its experts",
            "force-balanced routing: each token's 8 experts a uniform random draw",
            "Transformer Engine's CUDA graphs of the router and the dispatch preprocessing "
            "not priced: their launches are charged as without them", *DGX_H100)


def _ms(label: str, step: float, tflops: float, overlap: bool) -> PublishedRun:
    case = "overlap on" if overlap else "overlap off"
    return PublishedRun(
        f"MSK Qwen3-30B-A3B EP16 {case}", _SKILL, QWEN3_30B, "H100 SXM", 16, 1, 1, 1024,
        4096, step, "validation", f"step time {step:g} s ({tflops:g} model TFLOP/s per GPU)",
        recompute="none", zero=1, micro_batch=1, flash=True, dtype="bf16", ep=16, etp=1,
        options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1 dispatcher=flex"
        + (" overlap_ep=1" if overlap else ""),
        assumed=_ASSUMED,
        checked=f"row '| {label} | iterations 5-20 | {step:g}s | {tflops:g} |' (the table's case, "
        "steady window, step time and model TFLOP/s per GPU); " + _SETUP
        + ("; the EP overlap of the perf recipe (perf_recipes/qwen/h100/qwen3_moe.py at "
           "7ded17dae: overlap_moe_expert_parallel_comm True, delay_wgrad_compute False); "
           "the same case's independent validation over iterations 41-50 read 20.9920 s"
           if overlap else ""))


SKILL_RUNS: tuple[PublishedRun, ...] = (
    _ms("overlap off", 24.7138, 244.039, False),
    _ms("overlap on, search run", 21.0725, 286.208, True),
)
"""The two rows of the skill's HybridEP benchmark (module docstring)."""
