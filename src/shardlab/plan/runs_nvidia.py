"""Published runs from NVIDIA's Megatron-LM, NeMo and Megatron-Bridge tables (H100).

* MW: the Megatron-LM README, "Training Speed and Scalability" (commit f2e5db40, July
  2024; the table is the image ``images/model_table.png``, Megatron-Core r0.8.0): GPT
  models 1.7B-462B, vocabulary 131,072, sequence 4096, "fine-grained overlapping of
  data-parallel (``--overlap-grad-reduce --overlap-param-gather``), tensor-parallel
  (``--tp-comm-overlap``) and pipeline-parallel communication (enabled by default)".
  Per-GPU TFLOP/s, turned into seconds by Megatron's FLOP formula.
* NM: NVIDIA/NeMo ``docs/source/performance/performance_summary.md`` (commit e2de75c1,
  NeMo 24.07, DGX-H100; the file there is byte for byte 8e3d65dc's, "24.07 perf numbers",
  September 2024): pre-training at fp8, tokens/s per GPU with TP, PP, VP, MBS, GBS. The
  command lines are not public; the facts each row takes beyond the table come from
  NeMo-Framework-Launcher 24.07 (8325688d): its fp8 example scripts' bf16 gradient
  reduction (GPT-3 and Llama; its Nemotron-3 8B and 22B examples set none: fp32 assumed
  for those two), for Nemotron-4 340B its training config's optimizer dtype and
  recompute, and for Nemotron-3 8B and 22B their training configs' layout (TP, PP, VP),
  sequence parallel, no recompute and TP overlap.
* MB: NVIDIA-NeMo/Megatron-Bridge ``docs/performance-summary-archive.md`` (25.11
  DGX-H100 rows with their precision column "FP8-CS"; 25.09 MoE rows).
* ZQ: yanring/Megatron-MoE-ModelZoo ``best_practice/qwen3/readme.md`` (commit 798dfb50):
  Qwen3-235B-A22B on 256 H100 ("NVLink 4th Generation, InfiniBand 8x50 GB/s"), bf16,
  printed step times.
"""

from __future__ import annotations

from shardlab.config.catalog import get_model
from shardlab.config.model import ModelShape
from shardlab.plan.choices import fewer_at_ends
from shardlab.plan.published_run import PublishedRun, megatron_flops, tokens_step

DGX_H100 = ("DGX H100: 8 H100 SXM per node, NVLink 4, 8 x 400 Gb/s NDR NICs (the tables say "
        "only DGX-H100)",)


def _mw_model(name: str, heads: int, hidden: int, layers: int) -> ModelShape:
    return ModelShape(f"gpt-{name}", layers, hidden, heads, vocab=131072, context=4096,
                      style="gpt", tied=False, source="Megatron-LM README model table "
                      "(heads, hidden, layers); vocabulary 131,072 and sequence 4096 from its text")


def _mw(name: str, heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int,
        batch: int, tflops: float, mfu: int, role: str = "validation") -> PublishedRun:
    step = megatron_flops(batch, 4096, layers, hidden, 131072) / (gpus * tflops * 1e12)
    return PublishedRun(
        f"MW {name}", "Megatron-LM README, weak-scaling table (Megatron-Core r0.8.0)",
        _mw_model(name, heads, hidden, layers), "H100 SXM", gpus, tp, pp, batch, 4096, step,
        role, f"{tflops:g} TFLOP/s per GPU, MFU {mfu}% (Megatron's FLOP formula)",
        recompute="none", sp=tp > 1, zero=1, flash=True,
        options="overlap_dp=1 overlap_tp=1",
        assumed=("bf16 (the MFU against 989 TFLOP/s says so)", "micro-batch 1",
                 "pipeline sends not overlapped: Megatron-Core turns overlap_p2p_comm off for "
                 "the non-interleaved schedule assumed here (arguments.py: 'non-interleaved "
                 "schedule does not support overlapping p2p communication'), so the README's "
                 "'pipeline-parallel communication (enabled by default)' holds only with "
                 "virtual stages, which it does not state",
                 "no recompute, non-interleaved 1F1B (Megatron's defaults)",
                 "distributed optimizer (ZeRO-1: --overlap-param-gather needs it)",
                 "sequence parallel with tp > 1", "GELU MLP of 4h, MHA, untied "
                 "embeddings (the parameter counts of the model-size column)", *DGX_H100),
        checked="cells of images/model_table.png read from the image at commit f2e5db40 "
        "(model size, heads, hidden, layers, TP, PP, DP, GPUs, batch, TFLOP/s, MFU); MFU x "
        "989 TFLOP/s gives each TFLOP/s cell")


MW_RUNS: tuple[PublishedRun, ...] = (
    _mw("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8, 41),
    _mw("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9, 47),
    _mw("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1, 49, "calibration"),
    _mw("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6, 46),
    _mw("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7, 42),
    _mw("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5, 43),
    _mw("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8, 44),
    _mw("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4, 48),
    _mw("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9, 47),
)


def _nemo_gpt(name: str, layers: int, hidden: int, heads: int) -> ModelShape:
    return ModelShape(name, layers, hidden, heads, vocab=50257, context=2048, style="gpt",
                      tied=True, source="NeMo GPTConfig (layers, hidden, heads); GPT-2 BPE "
                      "vocabulary assumed")


NEMOTRON_4_340B = ModelShape(
    "nemotron-4-340b", 96, 18432, 96, vocab=256000, context=4096, kv_heads=8, d_ff=73728,
    style="gpt", tied=False, source="NeMo Nemotron4Config340B: 96 layers, 18432, 96 heads, 8 "
    "query groups, FFN 73728 (squared ReLU, two matrices), vocabulary 256,000")


_NM_BF16_GRADS = (
    "gradients held and reduced in bf16: NeMo-Framework-Launcher 24.07's fp8 examples "
    "(examples/training/*/h100/*_fp8*.sh at 8325688d) add '+training.model.optim."
    "grad_sync_dtype=bf16', and Apex's DistributedFusedAdam keeps its contiguous gradient "
    "buffer in grad_sync_dtype (the exact command lines are not public)")
_NM_FP32_GRADS = (
    "gradients reduced in fp32 (assumed): the launcher's Nemotron fp8 examples (examples/"
    "training/nemotron/h100/nemotron_8b_fp8.sh and nemotron_22b_fp8.sh at 8325688d, GBS 32 "
    "on one or two nodes: not the table's runs), unlike its GPT and Llama ones, add no "
    "grad_sync_dtype, so Apex's DistributedFusedAdam would reduce in its own dtype, fp32")


def _nemotron3(size: str, layers: int, hidden: int, heads: int) -> ModelShape:
    return ModelShape(f"nemotron-3-{size}", layers, hidden, heads, vocab=256000, context=4096,
                      d_ff=4 * hidden, style="gpt", tied=False, source=f"NeMo-Framework-"
                      "Launcher 24.07 launcher_scripts/conf/training/nemotron/"
                      f"nemotron_{size}.yaml (NeMo's Nemotron3Config{size.upper()} alike): "
                      f"{layers} layers, {hidden}, {heads} heads (multi-head), FFN "
                      f"{4 * hidden} (squared ReLU, two matrices), untied; its sentencepiece "
                      "vocabulary of 256,000")


def _nm(key: str, model: ModelShape, gpus: int, gbs: int, mbs: int, seq: int, tp: int,
        pp: int, vp: int, tokens: float, role: str = "validation", cp: int = 1,
        row: str = "", yaml: bool = False, fp32_grads: bool = False,
        config: str = "") -> PublishedRun:
    # yaml: the launcher's training config for the model states an optimizer dtype and a
    # recompute of its own (Nemotron-4 340B). fp32_grads: the launcher's fp8 example for
    # the model sets no bf16 gradient reduction. config: a launcher config the row matches.
    optimizer = "bf16" if yaml else ""
    return PublishedRun(
        f"NM {key}", "NVIDIA NeMo 24.07 performance summary (fp8, DGX-H100)", model,
        "H100 SXM", gpus, tp, pp, gbs, seq, tokens_step(gbs, seq, gpus, tokens), role,
        f"{tokens:g} tokens/s per GPU", recompute="selective" if yaml else "none",
        sp=tp > 1, zero=1, micro_batch=mbs, virtual=vp, flash=True, dtype="fp8",
        options="overlap_dp=1 overlap_tp=1" + ("" if fp32_grads else " reduce_dtype=bf16")
        + (f" optimizer_dtype={optimizer}" if optimizer else ""), cp=cp,
        assumed=("fp8 with Transformer Engine (the table's title: 'pre-training ... at FP8 "
                 "precision')", *(() if yaml else ("no recompute",)),
                 "distributed optimizer with overlapped "
                 "gradient reduce and parameter gather, tensor-parallel communication "
                 "overlap (NeMo's performance recipes)",
                 _NM_FP32_GRADS if fp32_grads else _NM_BF16_GRADS,
                 "sequence parallel with tp > 1", *((
                     "the launcher's nemotron_340b.yaml at 24.07 (whose own layout, PP 12 "
                     "VP 8 on 768 nodes, is not the table's): the optimizer's 'dtype: bf16', "
                     "so Adam's moments in bf16 and no fp32 master (NeMo then leaves Apex's "
                     "store_params off), and activations_checkpoint_granularity selective "
                     "(its ub_tp_comm_overlap False is not taken: docs/validation.md)",)
                   if yaml else ()),
                 *(("context parallel as Megatron-Core runs it (K/V passed around the cp "
                    "ring, priced as shardlab's all-gather of the same bytes), data parallel "
                    "= GPUs / (TP x PP x CP)",) if cp > 1 else ()), *DGX_H100),
        checked="rows of performance_summary.md at NeMo commit e2de75c1: GPUs, GBS, MBS, "
        f"sequence, TP, PP, CP {cp}, VP and tokens/s per GPU as quoted" + (
            f" ({row})" if row else "") + (f"; {config}" if config else ""))


_NM3_CONFIG = ("NeMo-Framework-Launcher 8325688d launcher_scripts/conf/training/nemotron/"
               "nemotron_{size}.yaml: {layout}, sequence_parallel true, "
               "activations_checkpoint_granularity null, ub_tp_comm_overlap true, "
               "distributed_fused_adam with overlap_grad_sync and overlap_param_sync (its "
               "micro_batch_size {mbs} is not the table's, which the row takes); fp8 hybrid "
               "with Transformer Engine (its fp8 example)")

NM_RUNS: tuple[PublishedRun, ...] = (
    _nm("GPT3-5B", _nemo_gpt("gpt3-5b", 24, 4096, 32), 64, 2048, 4, 2048, 1, 1, 1, 23406),
    _nm("GPT3-20B", _nemo_gpt("gpt3-20b", 44, 6144, 48), 64, 256, 2, 2048, 2, 1, 1, 5851),
    _nm("GPT3-175B 128", _nemo_gpt("gpt3-175b", 96, 12288, 96), 128, 256, 1, 2048, 4, 8, 6,
        716),
    _nm("GPT3-175B 512", _nemo_gpt("gpt3-175b", 96, 12288, 96), 512, 2048, 2, 2048, 4, 8,
        6, 825),
    _nm("Llama2-7B", get_model("llama-2-7b"), 8, 128, 1, 4096, 1, 1, 1, 16934),
    _nm("Llama2-13B", get_model("llama-2-13b"), 16, 128, 1, 4096, 1, 4, 10, 8715),
    _nm("Llama2-70B", get_model("llama-2-70b"), 64, 128, 1, 4096, 4, 4, 20, 1728),
    # Added 2026-12-06 (the table's two rows left out before, priced after they were
    # written down): Nemotron-3 8B and 22B, whose launcher configs state the table's TP/PP/VP.
    _nm("Nemotron-8B", _nemotron3("8b", 32, 4096, 32), 64, 256, 4, 4096, 2, 1, 1, 12507,
        row="'Nemotron-8B | 64 | 256 | 4 | 4096 | 2 | 1 | 1 | 1 | 12507 | 643'",
        fp32_grads=True, config=_NM3_CONFIG.format(size="8b", layout="TP 2 (PP 1)", mbs=2)),
    _nm("Nemotron-22B", _nemotron3("22b", 40, 6144, 48), 64, 256, 2, 4096, 2, 4, 10, 4312,
        row="'Nemotron-22B | 64 | 256 | 2 | 4096 | 2 | 4 | 1 | 10 | 4312 | 562'",
        fp32_grads=True, config=_NM3_CONFIG.format(size="22b", layout="TP 2, PP 4, VP 10, "
                                                    "overlap_p2p_comm True", mbs=1)),
    _nm("Nemotron-340B", NEMOTRON_4_340B, 128, 32, 1, 4096, 8, 8, 12, 326, yaml=True),
    # Context parallel (added with cp: issue 17).
    _nm("Llama3-8B CP2", get_model("llama-3-8b"), 8, 128, 1, 8192, 1, 1, 1, 12273, cp=2,
        row="'LLAMA3-8B | 8 | 128 | 1 | 8192 | 1 | 1 | 2 | 1 | 12273 | 711'"),
    _nm("Llama3-70B CP2", get_model("llama-3-70b"), 64, 128, 1, 8192, 4, 4, 5, 1524, cp=2,
        row="'LLAMA3-70B | 64 | 128 | 1 | 8192 | 4 | 4 | 2 | 5 | 1524 | 734'"),
)


# The catalog's Qwen3 MoE shapes (their config.json: 128 experts top 8, query/key norms);
# the ModelZoo's benchmarking YAML states the same layers, widths, heads and experts.
QWEN3_30B = get_model("qwen3-30b-a3b")
QWEN3_235B = get_model("qwen3-235b-a22b")

_MB25 = ("Megatron-Bridge v0.2.0 (25.11) scripts/performance: set_llama3_common_configs / "
         "set_llama31_common_configs grad_reduce_in_fp32 False (mixed precision and ddp); "
         "get_precision_config('fp8_cs'): bf16_with_fp8_current_scaling_mixed (tensorwise, "
         "fp8_param_gather True), first_last_layers_bf16 False; precision-aware optimizer only "
         "for bf16")

MB_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun(
        "MB Llama3-8B FSDP8", "Megatron-Bridge performance summary, 25.11 DGX-H100",
        get_model("llama-3-8b"), "H100 SXM", 8, 1, 1, 128, 8192,
        tokens_step(128, 8192, 8, 14451), "validation", "14,451 tokens/s per GPU",
        recompute="none", zero=3, flash=True, dtype="fp8",
        options="overlap_dp=1 reduce_dtype=bf16 fp8_params=1 fp8_recipe=tensorwise",
        assumed=("Megatron-FSDP as ZeRO-3 with overlapped gathers", "no recompute",
                 "weights gathered in fp8", *DGX_H100),
        checked="row 'LLAMA3_8B | 8 | FP8-CS | 128 | 1 | 8192 | 8 | 1 | 1 | 1 | n/a | 1 | 16 | "
        "14451 | 744' (GPUs, precision, GBS, MBS, seq, FSDP, TP, PP, CP, VP, EP, GA); " + _MB25),
    PublishedRun(
        "MB Llama3-70B", "Megatron-Bridge performance summary, 25.11 DGX-H100",
        get_model("llama-3-70b"), "H100 SXM", 64, 4, 8, 128, 8192,
        tokens_step(128, 8192, 64, 1602), "validation", "1,602 tokens/s per GPU",
        recompute="none", sp=True, zero=1, virtual=5, flash=True, dtype="fp8",
        options="overlap_dp=1 overlap_tp=1 reduce_dtype=bf16 fp8_params=1 "
        "fp8_recipe=tensorwise",
        assumed=("distributed optimizer, overlapped data- and tensor-parallel "
                 "communication (the perf recipes)", "no recompute", *DGX_H100),
        checked="row 'LLAMA3_70B | 64 | FP8-CS | 128 | 1 | 8192 | 0 | 4 | 8 | 1 | 5 | 1 | 64 | "
        "1602 | 719'; workload_base_configs.py LLAMA3_70B_H100_FP8_CS_BASE_CONFIG (TP 4, PP 8, "
        "VP 5, no recompute or offload; userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192); "
        + _MB25),
    PublishedRun(
        "MB Llama3.1-405B CP2", "Megatron-Bridge performance summary, 25.11 DGX-H100",
        get_model("llama-3.1-405b"), "H100 SXM", 1024, 8, 8, 512, 8192,
        tokens_step(512, 8192, 1024, 292), "validation", "292 tokens/s per GPU",
        recompute="none", sp=True, zero=1, virtual=8, flash=True, dtype="fp8", cp=2,
        stage_layers=fewer_at_ends(126, 64, 1),
        options="overlap_dp=1 overlap_tp=1 reduce_dtype=bf16 fp8_params=1 "
        "fp8_recipe=tensorwise",
        assumed=("distributed optimizer, overlapped data- and tensor-parallel "
                 "communication (the perf recipes)", "no recompute", "126 layers on 8 x 8 "
                 "chunks with the embedding and the loss counted as a layer each "
                 "(Megatron's --account-for-embedding/loss-in-pipeline-split): 1 + 62 x 2 + "
                 "1", "context parallel priced as an all-gather of K and V (Megatron-Core "
                 "passes the same K/V blocks around the cp ring)", *DGX_H100),
        checked="row 'LLAMA3.1_405B | 1024 | FP8-CS | 512 | 1 | 8192 | 0 | 8 | 8 | 2 | 8 | 1 | "
        "64 | 292 | 737' (GPUs, precision, GBS, MBS, seq, FSDP, TP, PP, CP, VP, EP, GA, "
        "tokens/s, TFLOP/s); LLAMA31_405B_H100_FP8_CS_BASE_CONFIG (no recompute or offload), "
        "account_for_embedding/loss_in_pipeline_split True (llama3.py); " + _MB25),
    PublishedRun(
        "MB Qwen3-30B-A3B", "Megatron-Bridge performance summary, 25.09 DGX-H100",
        QWEN3_30B, "H100 SXM", 16, 1, 2, 512, 4096, tokens_step(512, 4096, 16, 10494),
        "validation", "10,494 tokens/s per GPU", recompute="none", zero=1, micro_batch=2,
        virtual=24, flash=True, dtype="fp8", ep=8, etp=1, capacity_factor=1.0,
        options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1 fp8_params=1 "
        "fp8_recipe=tensorwise",
        assumed=("'tokendrop': balanced routing (the table's footnote forces balance only "
                 "for dropless rows)", *DGX_H100),
        checked="row 'Qwen3_30B_a3B (tokendrop) | 16 | 512 | 2 | 4096 | 0 | 1 | 2 | 1 | 24 | "
        "8 | 32 | 10494 | 241'; the 2509 recipe (Megatron-Bridge 2f5cd4845, 'Malay/qwen3 "
        "2509'): perf matrix h100 num_gpus_16 tp 1, pp 2, vp 24, ep 8, etp 1, cuda_graphs "
        "false, mbs 1 for bf16 and 2 for fp8_cs (so the row's MBS 2 is fp8 with per-tensor "
        "current scaling with fp8_param_gather True: helpers.get_precision_config at "
        "v0.1.0rc3, first/last-layer bf16 off), recompute null, moe_router_fusion, "
        "cross_entropy_fusion_impl te, grad_reduce_in_fp32 false; run_script.py "
        "apply_moe_token_drop: capacity factor 1.0, padded to capacity; "
        "Qwen3MoEModelProvider: moe_token_dispatcher_type alltoall, moe_grouped_gemm, "
        "moe_permute_fusion; the recipe's overlap_grad_reduce and overlap_param_gather. The "
        "25.11 table re-measured the same layout (FP8-CS, dropless, force-balanced) at 5,275 "
        "tokens/s per GPU, half this row"),
    PublishedRun(
        "MB Qwen3-30B-A3B EP16", "Megatron-Bridge performance summary, 26.04 DGX-H100",
        QWEN3_30B, "H100 SXM", 16, 1, 1, 1024, 4096, tokens_step(1024, 4096, 16, 8901),
        "validation", "8,901 tokens/s per GPU", recompute="none", zero=1, micro_batch=1,
        flash=True, dtype="fp8", ep=16, etp=1,
        options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1 dispatcher=flex fp8_params=1 "
        "fp8_recipe=tensorwise",
        assumed=("HybridEP (NVLink within a node, RDMA across the two) priced as DeepEP's "
                 "internode dispatch: each token once per remote node holding one of its "
                 "experts", "force-balanced routing: each token's 8 experts a uniform "
                 "random draw", *DGX_H100),
        checked="row '| DGX-H100 | 16 | FP8 | 1024 | 1 | 4096 | 0 | 1 | 1 | 1 | n/a | 16 | 8901 | "
        "205 |' (26.04 NeMo Container; 26.04.01 8960 and 26.06 8826 for the same layout) and "
        "its footnote 'In MoE training benchmarks, we force-balance the token distribution "
        "among experts and all benchmarks are token-dropless' (docs/performance-summary.md at "
        "74695a06d); scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: num_gpus 16, global_batch_size 1024, "
        "expert_model_parallel_size 16, moe_a2a_overlap False, moe_flex_dispatcher_backend "
        "'hybridep'; utils/precision.py: fp8 'hybrid', recipe 'tensorwise' (current "
        "scaling), fp8_param_gather, first/last layers not bf16; no CUDA graphs and no "
        "recompute in the FP8 config; ddp overlap_grad_reduce, overlap_param_gather, "
        "distributed optimizer, grad_reduce_in_fp32 False; cross_entropy_fusion_impl te; "
        "moe_grouped_gemm, moe_permute_fusion, moe_router_fusion, "
        "moe_router_force_load_balancing (set_qwen3_common_configs)"),
    PublishedRun(
        "MB Qwen3-235B-A22B EP32", "Megatron-Bridge performance summary, 26.04 DGX-H100",
        QWEN3_235B, "H100 SXM", 256, 2, 8, 8192, 4096, tokens_step(8192, 4096, 256, 1686),
        "validation", "1,686 tokens/s per GPU", recompute="none", sp=True, zero=1,
        micro_batch=1, virtual=4, flash=True, dtype="fp8", ep=32, etp=1,
        stage_layers=fewer_at_ends(94, 32, 1),
        options="overlap_dp=1 reduce_dtype=bf16 fused_loss=1 overlap_ep=1 fp8_params=1 "
        "fp8_recipe=tensorwise",
        assumed=("force-balanced routing: each token's 8 experts a uniform random draw",
                 *DGX_H100),
        checked="row '| DGX-H100 | 256 | FP8 | 8192 | 1 | 4096 | 0 | 2 | 8 | 1 | 4 | 32 | 1686 | "
        "250 |' (26.04 NeMo Container, docs/performance-summary.md at 74695a06d; the same "
        "layout 1,633 in 26.02, 1,611 in 26.02.01, 1,712 in 26.04.01) and its force-balance, "
        "dropless footnote; scripts/performance/configs/qwen/qwen3_workload_base_configs.py at "
        "v0.4.0 (0fbfe7d3e): QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2 = V1 with "
        "global_batch_size 8192, V1: num_gpus 256, TP 2, PP 8, VP 4, EP 32, ETP 1, "
        "moe_a2a_overlap True (overlap_moe_expert_parallel_comm, delay_wgrad_compute); "
        "qwen3_llm_pretrain.py qwen3_235b_a22b_pretrain_config_h100: moe_token_dispatcher_type "
        "alltoall, CommOverlapConfig(tp_comm_overlap=False); fp8 current scaling (tensorwise) "
        "with fp8_param_gather; no recompute, no CUDA graphs; ddp overlap_grad_reduce, "
        "overlap_param_gather, distributed optimizer, grad_reduce_in_fp32 False; "
        "cross_entropy_fusion_impl te; account_for_embedding/loss_in_pipeline_split (96 slots "
        "over 32 chunks: 2+3x30+2)"),
)


def _zq(key: str, tp: int, pp: int, vp: int, ep: int, zero: int, mbs: int, recompute: str,
        step: float, tflops: int, command: str, extra: str = "") -> PublishedRun:
    # 94 layers plus the embedding and the loss counted as a layer each
    # (--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split):
    # 96 = 3 per chunk, the first and the last chunk one layer fewer.
    split = fewer_at_ends(94, pp * vp, 1) if pp > 1 else ()
    return PublishedRun(
        f"ZQ Qwen3-235B {key}", "Megatron-MoE-ModelZoo, best_practice/qwen3/readme.md",
        QWEN3_235B, "H100 SXM", 256, tp, pp, 2048, 4096, step, "validation",
        f"step time {step} s ({tflops} TFLOP/s per GPU)", recompute=recompute, sp=True,
        zero=zero, micro_batch=mbs, virtual=vp, flash=True, ep=ep, etp=1, stage_layers=split,
        options="overlap_dp=1 fused_loss=1 dispatcher=flex" + extra,
        assumed=("Megatron's --moe-router-force-load-balancing (random logits: each token's "
                 "8 experts a uniform random draw)",),
        checked="the README's table rows (dispatcher DeepEP, system, precision BF16, GPUs 256, "
        "seq 4096, TP, CP, EP, PP, EDP, ETP 1, VPP, DP, FSDP, MBS, GBS 2048, GA, recompute, "
        "step time, TFLOP/s; code main(1e057005)); the YAML as of those rows (d95e6e5, Aug "
        "2025): --moe-token-dispatcher-type flex, --moe-enable-deepep, --moe-grouped-gemm "
        "(runtime.conf GROUPED_GEMM true), --moe-permute-fusion, --moe-router-fusion, "
        "--moe-router-dtype fp32, --cross-entropy-loss-fusion (te), --account-for-embedding- "
        "and --account-for-loss-in-pipeline-split, --use-distributed-optimizer, "
        "--overlap-grad-reduce, --overlap-param-gather, --sequence-parallel; no "
        "--tp-comm-overlap (sbatch_benchmarking.sh adds it for bf16 only later)"
        + ("" if "overlap_ep" in extra else
           " and no --overlap-moe-expert-parallel-comm (A2A_OVERLAP unset)") + "; " + command)


_NORM_ACT = " recompute_modules=moe_act+layernorm"

ZQ_RUNS: tuple[PublishedRun, ...] = (
    _zq("FSDP EP8", 2, 1, 1, 8, 3, 4, "full", 17.6, 276,
        "run_235b.sh before d95e6e5, 'Intra-node EP + FSDP solution': MBS 4, full recompute "
        "(uniform, 1 layer), --use-custom-fsdp --data-parallel-sharding-strategy "
        "optim_grads_params --no-gradient-accumulation-fusion (that script says TP 1, the "
        "table TP 2, DP 128, GA 4: the table is kept; the unfused gradient accumulation: "
        "fused_accumulation=0)", extra=" fused_accumulation=0"),
    _zq("TP4 PP8 EP8", 4, 8, 4, 8, 1, 1, "none", 29.0, 167,
        "run_235b.sh before d95e6e5, 'Intra-node EP + large TP solution': TP 4, PP 8, VPP 4, "
        "EP 8, --moe-router-force-load-balancing --moe-router-aux-loss-fusion, no recompute"),
    # EP 32 over DP 16: the expert layers fold the two tensor ranks (Megatron-Core's parallel
    # folding, ETP 1, EDP 1), expressible since the planner folds for --framework megatron.
    _zq("TP2 PP8 EP32", 2, 8, 4, 32, 1, 1, "selective", 19.7, 245,
        "the row '| 235B | DeepEP | H100 | BF16 | 256 | 4096 | 2 | 1 | 32 | 8 | 1 | 1 | 4 | 16 "
        "| / | 1 | 2048 | 128 | norm, act | 19.7 | 245 |' (code moe_dev(f3e6c5), in the README "
        "since 8017e11, May 2025); recompute 'norm, act': run_h100_235b.sh's "
        "--recompute-granularity selective --recompute-modules moe_act layernorm "
        "(recompute_modules=moe_act+layernorm)", extra=_NORM_ACT),
    _zq("TP2 PP8 EP32 A2A overlap", 2, 8, 4, 32, 1, 1, "selective", 17.6, 276,
        "the row '| 235B | DeepEP | H100 | BF16 | 256 | 4096 | 2 | 1 | 32 | 8 | 1 | 1 | 4 | 16 "
        "| / | 1 | 2048 | 128 | norm, act | 17.6 | 276 | | | +1f1b overlap | moe_dev(f3e6c5) |', "
        "the EP 32 row above with Megatron's 1F1B all-to-all overlap "
        "(--overlap-moe-expert-parallel-comm, the MoE report's merged FWD-BWD; run_h100_235b.sh "
        "A2A_OVERLAP=1); recompute 'norm, act' as above", extra=_NORM_ACT + " overlap_ep=1"),
)

NVIDIA_RUNS = MW_RUNS + NM_RUNS + MB_RUNS + ZQ_RUNS
