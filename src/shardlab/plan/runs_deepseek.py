"""Published DeepSeek-V3 runs: latent attention, 256 experts, multi-token prediction.

Two NVIDIA sources measure DeepSeek-V3 (671B, MLA, 256 routed experts top 8, one shared,
three dense layers first) at sequence 4096 with one multi-token-prediction depth
(``mtp_num_layers=1``: every row's TFLOP/s over its tokens/s is 260.0 GFLOP a token, the
Bridge/NeMo count with the MTP layer, 249.8 without; shardlab's count is that plus the
router's matmul, 0.64 GFLOP a token: ``tests/plan/test_runs_deepseek.py``):

* DGXC: NVIDIA/dgxc-benchmarking ``deepseek_v3/pretraining/README.md`` at tag v25.05 (NeMo
  25.04.01, ``scripts/performance/llm/pretrain_deepseek_v3.py`` at 7a8f1cc7),
  ``deepseek_v3/pretrain/README.md`` at v25.08.02 (NeMo 25.07.01, the script at 9244b1ec)
  and at v25.10.02 (Megatron-Bridge d7dfa764,
  ``scripts/performance/run_script.py``): the layout table and the "Training step time"
  (seconds per step).
* MBG: NVIDIA-NeMo/Megatron-Bridge ``docs/performance-summary.md`` (25.09 table at
  fa0315ae, perf configs at v0.1.0rc4; 26.02 table in ``performance-summary-archive.md``,
  configs on branch r0.3.0, 8301abfc0): tokens/s per GPU.

Every run forces balanced routing (``moe_router_force_load_balancing``: random logits, then
the model's group-limited routing, ``n_group`` 8 and ``topk_group`` 4) on mock data; the
v25.05 and 25.09 token-drop rows cap each expert at capacity factor 1.0 and pad to it.
The layouts place the embedding with the first layers and the MTP depth with the loss on
the last pipeline chunk (``[E+4t] + [4t]x14 + [t, mtp, loss]`` for PP x VP = 16; the
v25.05 rows ``num_layers_in_first/last_pipeline_stage``; 25.09 H100 ``Et|(tt|)*30mL``).
What the planner does not price, stated per run: the shared expert's overlap with the
dispatch (``moe_shared_expert_overlap``), Transformer Engine's partial CUDA graphs, the
delayed weight-gradient split. Left out, and why: GB300 and B300 (no such
accelerator here); the 25.11 rows (their configs are not on a released branch); the 26.06
and later rows (full-iteration CUDA graphs with experts padded to 1.5x capacity); Kimi K2
(the Muon optimizer, not priced); B300 rows. All are held out.
"""

from __future__ import annotations

from shardlab.config.catalog import get_model
from shardlab.config.model import with_mtp
from shardlab.plan.published_run import PublishedRun, bridge_fp8_recipe, tokens_step
from shardlab.plan.runs_dgxc import _GB200
from shardlab.plan.runs_nvidia import DGX_H100

DSV3_MTP = with_mtp(get_model("deepseek-v3"), 1)
"""DeepSeek-V3 as trained with one multi-token-prediction depth: 62 layers, the last the
MTP block (Megatron-Core's layer of the model's kind, plus its projection and head pass)."""

_FORCED = ("force-balanced routing (moe_router_force_load_balancing): random logits routed "
           "through DeepSeek-V3's group limit, each token's 8 experts from its best 4 of 8 "
           "groups (moe_router_num_groups 8, moe_router_group_topk 4: the model's config)")
_DROP = ("capacity factor 1.0 padded to capacity (MegatronTokenDropCallback / "
         "apply_moe_token_drop): every expert runs its capacity of rows")
_SHARED = "the shared expert's overlap with the dispatch (moe_shared_expert_overlap) not priced"
_UNFUSED = ("attention unfused (materialised scores, priced as flash=False): Transformer "
            "Engine's nvte_get_fused_attn_backend admits latent attention's head dims (q/k "
            "192, v 128) in training on Blackwell (sm100) only from cuDNN 9.11, through TE "
            "PR #1797 (released in TE 2.5, after this NeMo 25.04.01 container of the "
            "2025-06-10 tag); before it sm100 takes head dims <= 128, FlashAttention-2 needs "
            "equal q/k and v dims and FlashAttention-3 is Hopper's, so TE falls back to its "
            "unfused attention; the GB200 recipe alone recomputes core_attn (launch.sh: "
            "h100 RM='mla_up_proj', gb200 RM='core_attn'), what a materialised softmax needs")
_LAST = (4, *[4] * 14, 2)
"""PP x VP = 16 chunks: [E + 4t] + [4t] x 14 + [t, mtp, loss] (the recipes' layout map)."""


def _run(key: str, source: str, gpu: str, gpus: int, tp: int, pp: int, vp: int, ep: int,
         gbs: int, step: float, measured_from: str, dtype: str, split: tuple[int, ...],
         options: str, assumed: tuple[str, ...], checked: str,
         capacity: float = 0.0, flash: bool = True) -> PublishedRun:
    return PublishedRun(
        key, source, DSV3_MTP, gpu, gpus, tp, pp, gbs, 4096, step, "validation",
        measured_from, recompute="selective", sp=tp > 1, zero=1, micro_batch=1, virtual=vp,
        flash=flash, dtype=dtype, ep=ep, etp=1, capacity_factor=capacity, stage_layers=split,
        options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1" + options
        + (bridge_fp8_recipe(key) if dtype == "fp8" else ""),
        assumed=(_FORCED, *assumed), checked=checked)


_CS = ("; scripts/performance/utils/helpers.py get_precision_config at v0.1.0rc4: fp8 'cs' "
       "= bf16_with_fp8_current_scaling_mixed (tensorwise, fp8_param_gather True, "
       "first_last_layers_bf16 False)")
_MX = ("; scripts/performance/utils/precision.py get_precision_config at r0.3.0: fp8_mx = "
       "bf16_with_mxfp8_mixed (fp8_param_gather True, reuse_grad_buf_for_mxfp8_param_ag)")
_PAO = ("; recipes/deepseek/deepseek_v3.py: use_precision_aware_optimizer, main_params_dtype "
        "fp32, main_grads_dtype, exp_avg_dtype and exp_avg_sq_dtype bf16")
_DGXC = "NVIDIA dgxc-benchmarking"
_BRIDGE = "Megatron-Bridge performance summary"
_V25_05 = ("launch.sh at v25.05 and NeMo 7a8f1cc7 pretrain_deepseek_v3.py: MBS 1, GBS 8 x "
           "GPUs, moe_token_dispatcher_type alltoall, USE_TOKEN_DROP (capacity factor 1.0, "
           "pad to capacity), moe_shared_expert_overlap, moe_permute_fusion, "
           "cross_entropy_fusion_impl te, tp_comm_overlap False, "
           "num_layers_in_first_pipeline_stage 64 // pp - 1 and "
           "num_layers_in_last_pipeline_stage 64 // pp - 2, mtp_num_layers 1 "
           "(pretrain_recipe use_mtp), distributed_fused_adam; mean of iterations 11-44")
_R030 = ("deepseek_workload_base_configs.py on branch r0.3.0 (8301abfc0), V2 = V1 with GBS "
         "4096: moe_flex_dispatcher_backend 'hybridep', moe_a2a_overlap False, "
         "recompute_modules ['mla_up_proj']; deepseek_llm_pretrain.py: "
         "moe_router_force_load_balancing, overlap_grad_reduce, overlap_param_gather, "
         "grad_reduce_in_fp32 False, precision-aware optimizer (fp32 main params, bf16 main "
         "grads and moments), cross_entropy_fusion_impl te (overrides.py), mtp_num_layers 1, "
         "layout map (PP, VP) -> [E+4t] + [4t]x14 + [t, mtp, loss]")

DEEPSEEK_RUNS: tuple[PublishedRun, ...] = (
    _run("DGXC DeepSeek-V3 H100 1024", f"{_DGXC} v25.05 (NeMo 25.04.01), H100", "H100 SXM",
         1024, 2, 16, 1, 64, 8192, 52.04, "training step time 52.04 s", "bf16",
         (3, *[4] * 14, 3), " recompute_modules=mla_up_proj",
         (*DGX_H100, _DROP, _SHARED, "sequence parallel with TP 2 (Megatron-Core requires it "
          "with expert and tensor parallelism)", "the distributed optimizer's gradient "
          "reduce and parameter gather overlapped, in bf16 (NeMo's recipe defaults)"),
         "deepseek_v3/pretraining/README.md at v25.05: '| 671B | BF16 | 1024 | 4096 | 61 | 2 | "
         "16 | 1 | 64 | 1 | 32 | 1 | 1 | 8192 | 256 |' and 'Deepseek V3 BF16 H100 | 1024x "
         "H100 GPUs' 'Training step time (seconds per step)| 52.04' (163.7 TFLOP/s per GPU); "
         "H100: TP=2 PP=16 EP=64 VP=1 RM='mla_up_proj'; " + _V25_05, capacity=1.0),
    _run("DGXC DeepSeek-V3 H100 1024 v25.08", f"{_DGXC} v25.08.02 (NeMo 25.07.01), H100",
         "H100 SXM", 1024, 1, 8, 2, 64, 8192, 36.189, "training step time 36.189 s", "bf16",
         _LAST, " dispatcher=flex recompute_modules=mla_up_proj+mlp+moe",
         (*DGX_H100, "the distributed optimizer's gradient reduce and parameter gather "
          "overlapped (NeMo's MegatronCommOverlapCallback defaults)",
          "the MTP depth on the last chunk with the loss (the (8, 2) layout names no mtp "
          "entry; the TFLOP/s count includes it)"),
         "deepseek_v3/pretrain/README.md at v25.08.02: '| 671B | BF16/FP8-DS | 1024 | 4096 | 61 "
         "| 1 | 8 | 1 | 64 | 1 | 128 | 2 | 1 | 8192 | 64 | mla_up_proj,mlp,moe |' and "
         "'pretrain_deepseek_v3_bf16_gpus1024_tp1_pp8_cp1_vp2_ep64_mbs1_gbs8192 Success "
         "36.189 0.300 235.43 1.95' (iterations 35-44); launch.sh: TP=1 EP=64 PP=8 VP=2 "
         "RM='mla_up_proj mlp moe' MBS=1 GBS=JOB_TOTAL_GPUS*8 CG=false; NeMo 9244b1ec "
         "pretrain_deepseek_v3.py: for h100 moe_token_dispatcher_type flex, "
         "moe_enable_deepep, moe_shared_expert_overlap False, "
         "moe_router_force_load_balancing, moe_permute_fusion, apply_rope_fusion, layout "
         "(8, 2) [embedding + 4 decoder] + [4 decoder] x 14 + [decoder, loss]; "
         "scripts/performance/helpers.py cross_entropy_fusion_impl te; recipe "
         "grad_reduce_in_fp32 False"),
    _run("DGXC DeepSeek-V3 GB200 256", f"{_DGXC} v25.05 (NeMo 25.04.01), GB200", "GB200", 256,
         2, 4, 1, 64, 2048, 34.194, "training step time 34.194 s", "bf16", (15, 16, 16, 15),
         " recompute_modules=core_attn",
         (*_GB200, _DROP, _SHARED, "sequence parallel with TP 2",
          "the distributed optimizer's gradient reduce and parameter gather overlapped, in "
          "bf16 (NeMo's recipe defaults)", _UNFUSED),
         "deepseek_v3/pretraining/README.md at v25.05: '| 671B | BF16 | 256 | 4096 | 61 | 2 | "
         "4 | 1 | 64 | 1 | 32 | 1 | 1 | 2048 | 64 |' and 'Deepseek V3 BF16 GB200' 'Training "
         "step time (seconds per step)| 34.168 | 34.194 | 34.274' (128, 256, 512 GPUs); GB200: "
         "RM='core_attn'; " + _V25_05, capacity=1.0, flash=False),
    _run("DGXC DeepSeek-V3 GB200 256 v25.10", f"{_DGXC} v25.10.02 (Megatron-Bridge), GB200",
         "GB200", 256, 1, 4, 4, 64, 2048, 11.07148, "training step time 11,071.48 ms",
         "bf16", _LAST, " optimizer_dtype=bf16_moments recompute_modules=mla_up_proj",
         (*_GB200, _DROP, _SHARED),
         "deepseek_v3/pretrain/README.md at v25.10.02: '| BF16/FP8 | 256 | 4096 | 61 | 1 | 4 "
         "| 1 | 64 | 64 | 4 | 1 | 2048 | 32 |' and 'pretrain_deepseek_v3_bf16_gpus256_tp1_pp4_"
         "cp1_vp4_ep64_mbs1_gbs2048 Success 11071.480 8.236 769.50'; Megatron-Bridge "
         "d7dfa764 run_script.py: use_tokendrop for gb200 (apply_moe_token_drop: capacity "
         "factor 1.0, padded, moe_token_dispatcher_type alltoall), moe_shared_expert_overlap, "
         "recompute_modules ['mla_up_proj'], overlap_grad_reduce, no CUDA graphs (cuda_graphs "
         "false), deepseek_v3_llm_pretrain.yaml cross_entropy_fusion_impl te, "
         "mtp_num_layers 1, layout (4, 4) [E+4t] + [4t]x14 + [t, mtp, loss]" + _PAO,
         capacity=1.0),
    _run("MBG DeepSeek-V3 H100 1024 FP8", f"{_BRIDGE}, 25.09 DGX-H100", "H100 SXM", 1024, 2,
         8, 4, 64, 8192, tokens_step(8192, 4096, 1024, 1297), "1,297 tokens/s per GPU", "fp8",
         (1, *[2] * 30, 1),
         " dispatcher=flex overlap_ep=1 fp8_params=1 optimizer_dtype=bf16_moments "
         "recompute_modules=mla_up_proj+mlp",
         (*DGX_H100, "fp8 current (tensorwise) scaling, the table's main figure (its "
          "'(330)' is 128x128 blockwise)", "sequence parallel with TP 2",
          "overlap_grad_reduce False on H100: the gradient reduce-scatter priced as "
          "overlapped like the parameter gather", "the delayed weight-gradient split "
          "(delay_wgrad_compute) not priced"),
         "25.09 table (fa0315ae): '| DeepSeekV3 (dropless) | 1024 | 8192 | 1 | 4096 | 0 | 2 | "
         "8 | 1 | 4 | 64 | 128 | 1297 | 338 (330) |' and its force-balance footnote; "
         "deepseek_v3_llm_pretrain.yaml at v0.1.0rc4 (6725f704) h100.num_gpus_1024: TP 2, PP "
         "8, VP 4, EP 64, ETP 1, cuda_graphs false; enable_deepep for h100 (flex, DeepEP), "
         "A2A_1F1B (overlap_moe_expert_parallel_comm, delay_wgrad_compute), recompute_modules "
         "['mla_up_proj', 'mlp'], layout 'Et|(tt|)*30mL' (the MTP depth alone with the loss), "
         "mtp_num_layers 1, overlap_param_gather, precision-aware optimizer (bf16 main grads "
         "and moments), cross_entropy_fusion_impl te" + _CS + _PAO),
    _run("MBG DeepSeek-V3 GB200 256 FP8", f"{_BRIDGE}, 25.09 DGX-GB200", "GB200", 256, 1, 4, 4,
         64, 2048, tokens_step(2048, 4096, 256, 3454), "3,454 tokens/s per GPU", "fp8", _LAST,
         " fp8_params=1 optimizer_dtype=bf16_moments recompute_modules=mla_up_proj",
         (*_GB200, _DROP, _SHARED, "fp8 current (tensorwise) scaling, the table's main "
          "figure (its '(2835)' is MXFP8 at PP 8 VP 2)"),
         "25.09 table (fa0315ae): '| DeepSeekV3 (tokendrop) | 256 | 2048 | 1 | 4096 | 0 | 1 | "
         "4 (8) | 1 | 4 (2) | 64 | 32 (64) | 3454 (2835) | 899 (738) |'; v0.1.0rc4 yaml "
         "gb200.num_gpus_256: TP 1, PP 4, VP 4, EP 64, cuda_graphs false; token drop "
         "(apply_moe_token_drop, capacity factor 1.0, padded, moe_token_dispatcher_type "
         "alltoall), moe_shared_expert_overlap, recompute_modules ['mla_up_proj'], "
         "overlap_grad_reduce, cross_entropy_fusion_impl te, mtp_num_layers 1, layout (4, 4)"
         + _CS + _PAO, capacity=1.0),
    _run("MBG DeepSeek-V3 B200 256 FP8", f"{_BRIDGE}, 25.09 DGX-B200", "B200", 256, 1, 16, 1,
         8, 2048, tokens_step(2048, 4096, 256, 2265), "2,265 tokens/s per GPU", "fp8", _LAST,
         " fp8_params=1 optimizer_dtype=bf16_moments recompute_modules=mla_up_proj",
         (_DROP, _SHARED, "DGX B200: 8 GPUs per node, 8 x 400 Gb/s", "fp8 current "
          "(tensorwise) scaling, the table's main figure (its '(2159)' is MXFP8)"),
         "25.09 table (fa0315ae): '| DeepSeekV3 (tokendrop) | 256 | 2048 | 1 | 4096 | 0 | 1 | "
         "16 | 1 | 1 | 8 | 128 | 2265 (2159) | 589 (562) |'; v0.1.0rc4 yaml b200.num_gpus_256: "
         "TP 1, PP 16, VP null, EP 8, ETP 1, cuda_graphs false; token drop as GB200 "
         "(moe_token_dispatcher_type alltoall), recompute_modules ['mla_up_proj'], "
         "cross_entropy_fusion_impl te, mtp_num_layers 1, layout (16, 1)" + _CS + _PAO,
         capacity=1.0),
    _run("MBG DeepSeek-V3 GB200 256 MXFP8", f"{_BRIDGE}, 26.02 DGX-GB200", "GB200", 256, 1, 4,
         4, 64, 4096, tokens_step(4096, 4096, 256, 3955), "3,955 tokens/s per GPU", "fp8",
         _LAST, " dispatcher=flex fp8_params=1 optimizer_dtype=bf16_moments "
         "recompute_modules=mla_up_proj",
         (*_GB200, "MXFP8 priced as the linear layers in fp8 with MXFP8's casts",
          "HybridEP (flex) inside one "
          "NVLink 5 domain priced as a token-based dispatch: each token once per rank its "
          "experts lie on", "Transformer Engine's CUDA graphs of attention, router and "
          "dispatch preprocessing not priced"),
         "26.02 table (archive): '| DGX-GB200 | 256 | MXFP8 | 4096 | 1 | 4096 | 0 | 1 | 4 | 1 "
         "| 4 | 64 | 3955 | 1028 |' and its force-balance, dropless footnote (26.02.01: 4021); "
         "GB200_V1: PP 4, VP 4, EP 64, cuda_graph_impl 'transformer_engine', scope ['attn', "
         "'moe_router', 'moe_preprocess']; " + _R030 + _MX),
    _run("MBG DeepSeek-V3 B200 256 MXFP8 EP32", f"{_BRIDGE}, 26.04.01 DGX-B200", "B200", 256,
         1, 8, 2, 32, 4096, tokens_step(4096, 4096, 256, 3328), "3,328 tokens/s per GPU",
         "fp8", _LAST, " dispatcher=flex overlap_ep=1 fp8_params=1 "
         "optimizer_dtype=bf16_moments recompute_modules=mla_up_proj+mlp",
         ("DGX B200: 8 GPUs per node, 8 x 400 Gb/s", "MXFP8 priced as the linear layers in "
          "fp8", "Transformer Engine's CUDA graphs of attention, router and dispatch "
          "preprocessing not priced", "the delayed weight-gradient split "
          "(delay_wgrad_compute) not priced"),
         "26.04.01 table (archive): '| DGX-B200 | 256 | MXFP8 | 4096 | 1 | 4096 | 0 | 1 | 8 | 1 "
         "| 2 | 32 | 3328 | 864 |' and its force-balance, dropless footnote; "
         "deepseek_workload_base_configs.py on branch r0.4.0 (3743c703): "
         "DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2: moe_flex_dispatcher_backend 'deepep', "
         "PP 8, VP 2, EP 32, GBS 4096, moe_a2a_overlap True (overrides.py: "
         "overlap_moe_expert_parallel_comm, delay_wgrad_compute, moe_shared_expert_overlap "
         "False), pp_layout 'Et*4|(t*4|)*14tmL', cuda_graph_impl 'transformer_engine', scope "
         "['attn', 'moe_router', 'moe_preprocess'], recompute_modules ['mla_up_proj', 'mlp']; "
         "deepseek_llm_pretrain.py overlap_grad_reduce, moe_router_force_load_balancing; "
         "overrides.py cross_entropy_fusion_impl te; precision.py fp8_mx = "
         "bf16_with_mxfp8_mixed (fp8_param_gather True)" + _PAO),
    _run("MBG DeepSeek-V3 B200 256 MXFP8", f"{_BRIDGE}, 26.02 DGX-B200", "B200", 256, 1, 16,
         1, 8, 4096, tokens_step(4096, 4096, 256, 2689), "2,689 tokens/s per GPU", "fp8",
         _LAST, " dispatcher=flex fp8_params=1 optimizer_dtype=bf16_moments "
         "recompute_modules=mla_up_proj",
         ("DGX B200: 8 GPUs per node, 8 x 400 Gb/s", "MXFP8 priced as the linear layers in "
          "fp8", "HybridEP (flex) inside the 8-GPU NVLink domain priced as a token-based "
          "dispatch"),
         "26.02 table (archive): '| DGX-B200 | 256 | MXFP8 | 4096 | 1 | 4096 | 0 | 1 | 16 | 1 "
         "| n/a | 8 | 2689 | 699 |' and its force-balance, dropless footnote (26.02.01: "
         "2790); B200_V1: PP 16, EP 8, no CUDA graphs; " + _R030 + _MX),
)
