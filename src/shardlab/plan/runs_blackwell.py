"""Published runs on Blackwell (B200, GB200 NVL72): Megatron-Bridge's performance summary.

* MBG: NVIDIA-NeMo/Megatron-Bridge ``docs/performance-summary.md`` and
  ``docs/performance-summary-archive.md``, DGX-B200 (8 GPUs, one NVLink 5 domain each) and
  DGX-GB200 (NVL72: one NVLink 5 domain of 72 GPUs, what Megatron-Bridge's own HybridEP
  plugin states: "GB200/GB300 use NVL72 topology", ``NVLINK_DOMAIN_SIZE = "72"``), tokens/s
  per GPU with each row's precision, GBS, MBS, TP, PP, CP, VP and EP, and the perf config of
  the release that measured it (scripts/performance/configs at the release's tag: the
  ``checked`` field of each run says which). FP8 is current (tensorwise) scaling, MXFP8
  32-element block scaling; both run the linear layers in fp8 and are priced alike.

The Blackwell curve fits ``peak_fraction`` on NVIDIA dgxc-benchmarking's Llama 3.1 405B bf16
on 256 GB200 (:mod:`shardlab.plan.runs_dgxc`); its fp8 linear matmuls take the same share
of the fp8 peak (:data:`shardlab.config.hardware.FP8_SHARE_SOURCE`), so the Llama 3.1 405B
FP8 run below, which calibrated an fp8 share before, is held out like the rest;
``half_intensity``, the launch cost and the link fraction are the H100 fit's.
"""

from __future__ import annotations

from shardlab.config.catalog import get_model
from shardlab.plan.choices import fewer_at_ends
from shardlab.plan.published_run import PublishedRun, bridge_fp8_recipe, tokens_step

_SRC = "Megatron-Bridge performance summary"
_PLAIN = ("no recompute, no CUDA graphs, distributed optimizer with overlapped gradient "
          "reduce and parameter gather, grad_reduce_in_fp32 False, cross_entropy_fusion_impl "
          "te (set_workload_base_configs, the Llama recipes)")


_CS26 = ("; fp8_cs (26.04-alpha 406d3be7 utils/precision.py): tensorwise current scaling, "
         "fp8_param_gather True, first_last_layers_bf16 False")
_CS25 = ("; get_precision_config('fp8_cs') at v0.2.0: bf16_with_fp8_current_scaling_mixed "
         "(tensorwise, fp8_param_gather True), first_last_layers_bf16 False")


def _llama(key: str, model: str, gpu: str, gpus: int, gbs: int, mbs: int, tp: int, pp: int,
           vp: int, tokens: float, release: str, row: str, config: str,
           role: str = "validation", zero: int = 1, split: tuple[int, ...] = (),
           options: str = "overlap_dp=1 reduce_dtype=bf16 fused_loss=1",
           assumed: tuple[str, ...] = ()) -> PublishedRun:
    return PublishedRun(
        f"MBG {key}", f"{_SRC}, {release} {gpu}", get_model(model), gpu, gpus, tp, pp, gbs,
        8192, tokens_step(gbs, 8192, gpus, tokens), role, f"{tokens:,g} tokens/s per GPU",
        recompute="none", sp=tp > 1, zero=zero, micro_batch=mbs, virtual=vp, flash=True,
        dtype="fp8", stage_layers=split,
        options=options + (" overlap_tp=1" if tp > 1 else "") + bridge_fp8_recipe(key),
        assumed=(*assumed, "fp8 (current or MX block scaling) priced as the linear layers "
                 "in fp8 with the recipe's casts",
                 "sequence parallel and Transformer Engine's userbuffers "
                 "tensor-parallel overlap with tp > 1 (the Llama recipes' "
                 "CommOverlapConfig)" if tp > 1 else "no tensor parallelism"),
        checked=f"row {row} ({release}); {config}")


LLAMA_RUNS: tuple[PublishedRun, ...] = (
    _llama("Llama3.1-405B GB200 FP8", "llama-3.1-405b", "GB200", 256, 1536, 1, 4, 16, 4, 842,
           "26.04", "'| DGX-GB200 | 256 | FP8 | 1536 | 1 | 8192 | 0 | 4 | 16 | 1 | 4 | n/a | "
           "842 | 2126 |' (26.02 793, 26.02.01 818, 26.04.01 864, 26.06 843)",
           "llama31_workload_base_configs.py at v0.4.0: FP8_CS V2 num_gpus 256, TP 4, PP 16, CP "
           "1, VP 4, GBS 1536, use_megatron_fsdp False, cpu_offloading_num_layers None; "
           "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192; "
           "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
           "(llama3.py: 128 slots over 64 chunks, 1+2x62+1); " + _PLAIN + _CS26,
           split=fewer_at_ends(126, 64, 1),
           options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1 fp8_params=1"),
    _llama("Llama3-70B GB200 MXFP8", "llama-3-70b", "GB200", 64, 256, 1, 2, 4, 5, 3828,
           "26.04", "'| DGX-GB200 | 64 | MXFP8 | 256 | 1 | 8192 | 0 | 2 | 4 | 1 | 5 | n/a | "
           "3828 | 1721 |' (26.02 3613, 26.02.01 3837, 26.04.01 3712)",
           "llama3_workload_base_configs.py at v0.4.0: FP8_MX TP 2, PP 4, VP 5, MBS 1, GBS "
           "256; userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192; precision fp8_mx (e4m3, "
           "recipe mxfp8, fp8_param_gather); " + _PLAIN,
           options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1 fp8_params=1"),
    _llama("Llama3-70B GB200 FP8 FSDP", "llama-3-70b", "GB200", 64, 256, 2, 1, 1, 1, 4143,
           "26.04", "'| DGX-GB200 | 64 | FP8 | 256 | 2 | 8192 | 64 | 1 | 1 | 1 | n/a | n/a | "
           "4143 | 1861 |' (26.02 4040, 26.02.01 4357, 26.04.01 4224)",
           "llama3_workload_base_configs.py at v0.4.0: FP8_CS micro_batch_size 2, "
           "use_megatron_fsdp True (optim_grads_params), cpu_offloading_num_layers 40, GBS "
           "256; fsdp_double_buffer, gradient_accumulation_fusion False "
           "(llama3_llm_pretrain.py); " + _PLAIN + _CS26, zero=3,
           options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1 fused_accumulation=0 "
           "fp8_params=1 offload_layers=40",
           assumed=("the activations of 40 layers offloaded to the Grace CPU over "
                    "NVLink-C2C and back beside the compute (offload_layers=40)",)),
    _llama("Llama3-8B GB200 FP8", "llama-3-8b", "GB200", 8, 128, 2, 1, 1, 1, 31508,
           "25.11", "'| LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a "
           "| 1 | 8 | 31508 (29789) | 1622 (1533) |' (25.09 31357)",
           "llama3/workload_base_configs.py at v0.2.0: micro_batch_size 2, cuda_graph_impl "
           "'local', cuda_graph_scope 'full_iteration' (the whole step in one CUDA graph), "
           "tp_comm_overlap off (TP 1); distributed optimizer, overlapped gradient reduce and "
           "parameter gather, grad_reduce_in_fp32 False, cross-entropy fusion" + _CS25,
           options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1 fp8_params=1"),
    _llama("Llama3-8B B200 FP8", "llama-3-8b", "B200", 8, 128, 2, 1, 1, 1, 30624,
           "25.11", "'| LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a "
           "| 1 | 8 | 30624 (29521) | 1576 (1519) |' (25.09 29994)",
           "llama3/workload_base_configs.py at v0.2.0: B200 as GB200, micro_batch_size 2, "
           "full-iteration CUDA graph; distributed optimizer, overlapped gradient reduce and "
           "parameter gather, grad_reduce_in_fp32 False, cross-entropy fusion" + _CS25,
           options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1 fp8_params=1"),
)


def _qwen3(key: str, model: str, gpu: str, gpus: int, gbs: int, mbs: int, pp: int, vp: int,
           ep: int, tokens: float, release: str, row: str, config: str,
           dispatcher: str, split: tuple[int, ...] = ()) -> PublishedRun:
    flex = dispatcher == "flex"
    return PublishedRun(
        f"MBG {key}", f"{_SRC}, {release} {gpu}", get_model(model), gpu, gpus, 1, pp, gbs,
        4096, tokens_step(gbs, 4096, gpus, tokens), "validation",
        f"{tokens:,g} tokens/s per GPU", recompute="none", zero=1, micro_batch=mbs,
        virtual=vp, flash=True, dtype="fp8", ep=ep, etp=1, stage_layers=split,
        options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1" + bridge_fp8_recipe(key)
        + (" dispatcher=flex" if flex else ""),
        assumed=("MXFP8 priced as the linear layers in fp8 with MXFP8's casts",
                 "force-balanced routing: each token's 8 experts a uniform random draw "
                 "(the tables' footnote: 'we force-balance the token distribution among "
                 "experts and all benchmarks are token-dropless')",
                 *(("HybridEP (flex) inside one NVLink 5 domain priced as a token-based "
                    "dispatch: each token once per rank its experts lie on",) if flex else ())),
        checked=f"row {row} ({release}); {config}; set_qwen3_common_configs: recompute None, "
        "moe_router_fusion, moe_router_force_load_balancing, grad_reduce_in_fp32 False; "
        "set_workload_base_configs: cross_entropy_fusion_impl te; moe_permute_fusion, "
        "moe_grouped_gemm, overlapped gradient reduce and parameter gather"
        + ("" if flex else "; moe_token_dispatcher_type alltoall"))


QWEN3_RUNS: tuple[PublishedRun, ...] = (
    _qwen3("Qwen3-30B-A3B GB200 MXFP8", "qwen3-30b-a3b", "GB200", 8, 512, 4, 1, 1, 8, 26032,
           "26.04", "'| DGX-GB200 | 8 | MXFP8 | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | n/a | 8 | "
           "26032 | 599 |' (26.02.01 26373, 26.04.01 26112)",
           "qwen3_workload_base_configs.py at v0.4.0: GB200 micro_batch_size 4, "
           "moe_flex_dispatcher_backend 'hybridep', cuda_graph_impl 'transformer_engine', "
           "cuda_graph_scope ['moe_router', 'moe_preprocess'] (the router and the dispatch "
           "preprocessing graphed, not priced)", "flex"),
    _qwen3("Qwen3-30B-A3B B200 MXFP8", "qwen3-30b-a3b", "B200", 8, 512, 4, 1, 1, 8, 26859,
           "26.04", "'| DGX-B200 | 8 | MXFP8 | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | n/a | 8 | "
           "26859 | 618 |' (26.02.01 26695, 26.04.01 27136)",
           "qwen3_workload_base_configs.py at v0.4.0: B200 micro_batch_size 4, "
           "moe_flex_dispatcher_backend 'hybridep', cuda_graph_impl 'transformer_engine', "
           "cuda_graph_scope ['attn', 'moe_router', 'moe_preprocess'] (not priced)", "flex"),
    _qwen3("Qwen3-235B-A22B GB200 MXFP8", "qwen3-235b-a22b", "GB200", 256, 8192, 1, 8, 3, 32,
           5672, "26.04", "'| DGX-GB200 | 256 | MXFP8 | 8192 | 1 | 4096 | 0 | 1 | 8 | 1 | 3 "
           "| 32 | 5672 | 840 |' (26.04.01 5680)",
           "qwen3_workload_base_configs.py at v0.4.0: num_gpus 256, PP 8, VP 3, EP 32, GBS "
           "8192, moe_flex_dispatcher_backend 'hybridep', cuda_graph_impl "
           "'transformer_engine', scope ['attn', 'moe_router', 'moe_preprocess'] (not "
           "priced); account_for_embedding/loss_in_pipeline_split (96 slots over 24 chunks: "
           "3+4x22+3)", "flex", split=fewer_at_ends(94, 24, 1)),
    _qwen3("Qwen3-235B-A22B B200 MXFP8", "qwen3-235b-a22b", "B200", 256, 8192, 1, 8, 1, 8,
           3776, "26.04.01", "'| DGX-B200 | 256 | MXFP8 | 8192 | 1 | 4096 | 0 | 1 | 8 | 1 | "
           "n/a | 8 | 3776 | 560 |' (26.02 3805)",
           "qwen3_workload_base_configs.py at v0.4.1: num_gpus 256, PP 8, EP 8, GBS 8192, no "
           "HybridEP or DeepEP backend (NCCL's all-to-all), no CUDA graph, no all-to-all "
           "overlap; "
           "account_for_embedding/loss_in_pipeline_split (96 slots over 8 stages: "
           "11+12x6+11)", "alltoall", split=fewer_at_ends(94, 8, 1)),
)

BLACKWELL_RUNS: tuple[PublishedRun, ...] = LLAMA_RUNS + QWEN3_RUNS
