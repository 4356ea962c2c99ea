"""NVIDIA's DGX Cloud benchmarking recipes: bf16 and fp8 on GB200 NVL72 and on H100.

DGXC: NVIDIA/dgxc-benchmarking, tags v25.05 to v25.05.05 (v25.05.05, c5c765f2, quoted;
the H100 rows appear in v25.05.01, Grok-1's H100 figures changed in v25.05.02 and the 405B
H100 layout's GA in v25.05.05; the rest is the same in every v25.05.x tag):
``llama3.1/``, ``nemotron/`` and ``grok1/README.md`` give each run's layout table (TP, PP,
CP, VP, MBS, GBS, DP, GA) and its "Training step time (seconds per step)", the mean of
iterations 11-44 of a 50-step run on mock data (``common/parse_train_timing.sh``). The
runs launch NeMo 25.04's ``scripts/performance/llm/pretrain_llama31_405b.py`` and
``pretrain_nemotron4_340b.py`` (NeMo r2.3.0 branch ``llmb-nemo-r2.3.0``: 6f2c6fda for
Llama, b4148d21 for Nemotron; ``launch.sh`` gives the flags). What those set, as read:

* bf16 (``bf16_mixed``) or fp8 (``bf16_with_fp8_mixed``: Transformer Engine's delayed
  scaling, ``fp8_param_gather``: the distributed optimizer gathers fp8 weights); no
  recompute and no activation offload (no CSV row sets ``recompute_layers`` or
  ``activation_offload_layers`` for these GPU counts);
* the distributed optimizer with gradient reduce and parameter gather overlapped, the
  reduction in bf16 (the plugin's ``grad_reduce_in_fp32 = False`` overrides the DDP
  config); Transformer Engine's cross-entropy fusion (``cross_entropy_fusion_impl = "te"``);
* sequence parallel with TP > 1 and TP communication overlap (``MegatronCommOverlapCallback,
  tp_comm_overlap=True``; the userbuffers configs ``userbuffers_bf16_b200_h16384_tp4_cp2_
  mbs1_seqlen8192``, ``..._h100_h16384_tp8_cp2...``, ``..._b200_h18432_tp8_mbs1_
  seqlen4096``; Transformer Engine's default on the H100 340B);
* Llama 3.1 405B counts its embedding and loss as pipeline layers
  (``account_for_embedding_in_pipeline_split``, ``..._loss_...``: 128 slots over 64
  chunks, 1 + 2 x 62 + 1); Nemotron-4 340B splits its 96 layers evenly;
* CUDA graphs only on the Nemotron GB200 rows (``--cuda_graphs true``: Transformer
  Engine's per-layer graphs), not priced;
* the attention kernel Transformer Engine 2.1-2.4 selects: cuDNN's fused kernel, except
  on Blackwell above head dim 128 (Nemotron-4 340B's 192 on GB200), where it falls back to
  FlashAttention-2 (:func:`_te_kernel`);
* Nemotron-4 15B on 16 H100: TP 2, MBS 2, no virtual stages (``launch.sh``).
* GB200: 4 GPUs per tray, jobs in 16-tray (64-GPU) segments of NVL72 racks; H100: DGX
  H100, 8 per node, 8 x 400 Gb/s.

Grok-1 314B (``grok1/README.md``, NeMo 6f2c6fda's ``pretrain_grok1_314b.py``: Mixtral's
config at 64 layers, 6144 wide, 48 heads, 8 query groups, 8 experts of FFN 32768, top 2,
Megatron's all-to-all dispatcher, ``MegatronTokenDropCallback``: capacity factor 1.0,
padded to capacity) runs TP 4 EP 8 with expert tensor parallel 4 on GB200 (the experts
folded over the tensor and data ranks, with CUDA graphs) and TP 4 PP 8 CP 2 VP 8 EP 8 on
H100; its userbuffers config is ``userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192``
for every GPU and precision. Every row of the v25.05.05 tables whose model shardlab can
express is here; Llama 4 Maverick (dense and MoE layers interleaved), Nemotron-H (a hybrid
Mamba stack) and DeepSeek-V3 (latent attention) are not.

Role: the 405B bf16 on 256 GB200 is the Blackwell curve's **bf16 calibration run**, chosen as
the twin of Megatron-Bridge's Llama 3.1 405B FP8 on 256 GB200
(:mod:`shardlab.plan.runs_blackwell`: same model, GPU and count), which calibrated an fp8
share until the ninth revision of docs/validation.md and is held out now. The rest are held
out.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.config.catalog import get_model
from shardlab.config.hardware import get_accelerator
from shardlab.config.model import ModelShape, MoE
from shardlab.plan.choices import fewer_at_ends
from shardlab.plan.options import te_falls_back
from shardlab.plan.published_run import PublishedRun
from shardlab.plan.runs_nvidia import DGX_H100, NEMOTRON_4_340B

_SRC = "NVIDIA dgxc-benchmarking v25.05.x (NeMo 25.04)"
_SET = ("no recompute, no offload (set_primary_perf_configs with recompute_layers 0 and "
        "activation_offload_layers 0 for these GPU counts); distributed optimizer, "
        "overlap_grad_reduce and overlap_param_gather, grad_reduce_in_fp32 False (the "
        "plugin); cross_entropy_fusion_impl te; tp_comm_overlap True")
_PRECISION = {"bf16": "bf16_mixed (no fp8)",
              "fp8": "bf16_with_fp8_mixed: fp8 'hybrid', fp8_recipe 'delayed', "
                     "fp8_param_gather True"}
_GB200 = ("DGX GB200: 4 GPUs per tray, 4 x ConnectX-7 400 Gb/s per tray, NVL72 racks (the "
          "jobs run in 16-tray segments: one NVLink domain per 64 GPUs)",)
# NullTokenizer(256000) adds one token; Megatron pads to a multiple of 128 x TP.
_NEMOTRON = {"340b": replace(NEMOTRON_4_340B, vocab=257024),
             "15b": ModelShape("nemotron-4-15b", 32, 6144, 48, vocab=256256, context=4096,
                               kv_heads=8, d_ff=24576, style="gpt", tied=False,
                               source="NeMo Nemotron4Config15B: 32 layers, 6144, 48 heads, 8 "
                               "query groups, FFN 24576 (squared ReLU, two matrices); "
                               "NullTokenizer 256,000 + 1 padded to 128 x TP 2")}


# Grok-1 as NeMo's script defines it on Mixtral's config (moe_ffn_hidden_size unset: the
# experts take ffn_hidden_size); the Llama 3 70B tokenizer's 128,256 padded to 128 x TP 4.
_GROK1 = ModelShape("grok-1-314b", 64, 6144, 48, vocab=128512, context=8192, kv_heads=8,
                    d_ff=32768, style="llama", tied=False,
                    moe=MoE(experts=8, experts_per_token=2, expert_d_ff=32768),
                    source="NeMo pretrain_grok1_314b.py (6f2c6fda): MixtralConfig8x7B with 64 "
                    "layers, hidden 6144, 48 heads, 8 query groups, ffn_hidden_size 32768, 8 "
                    "experts, top 2; tokenizer meta-llama/Meta-Llama-3-70B")


def _grok(gpu: str, gpus: int, step: float, dtype: str, table: str) -> PublishedRun:
    gb200 = gpu == "GB200"
    tp, pp, cp, vp, etp = (4, 1, 1, 1, 4) if gb200 else (4, 8, 2, 8, 1)
    return PublishedRun(
        f"DGXC Grok1-314B {'GB200' if gb200 else 'H100'} {gpus} {dtype.upper()}",
        f"{_SRC}, {gpu}", _GROK1, gpu, gpus, tp, pp, 2 * gpus, 8192, step, "validation",
        f"training step time {step} s (mean of iterations 11-44)", recompute="none",
        sp=True, zero=1, micro_batch=1, virtual=vp, flash=True, cp=cp, dtype=dtype, ep=8,
        etp=etp, capacity_factor=1.0,
        options="overlap_dp=1 overlap_tp=1 reduce_dtype=bf16 fused_loss=1"
        + (" fp8_params=1 fp8_recipe=delayed" if dtype == "fp8" else ""),
        assumed=(*(_GB200 if gb200 else DGX_H100),
                 "capacity factor 1.0 padded to capacity: every expert runs its capacity of "
                 "rows (balanced routing priced)",
                 *(("Transformer Engine's per-layer CUDA graphs (--cuda_graphs true) not "
                    "priced",) if gb200 else ("context parallel as Megatron-Core runs it",))),
        checked=f"grok1/README.md: {table}; launch.sh: -tp {tp} -pp {pp} -cp {cp} -ep 8 -vp "
        f"{vp} -et {etp} -gb {2 * gpus} -mb 1 --cuda_graphs {str(gb200).lower()}; no "
        "recommended-config CSV row (defaults: no recompute, offload or FSDP); "
        "moe_token_dispatcher_type alltoall (MixtralConfig); MegatronTokenDropCallback "
        f"(capacity factor 1.0, pad to capacity); {_PRECISION[dtype]}; " + _SET)


_TE_SM100 = ("attention through FlashAttention-2 (flash_kernel=fa2, at its B200 benchmarks' "
             "share: FA2_BLACKWELL_SHARE): Transformer Engine 2.1-2.4 (NeMo 25.04's) admits "
             "cuDNN's fused attention on Blackwell (sm100) only at head dims <= 128 "
             "(fused_attn.cpp: '!(sm_arch_ >= 100 && (head_dim_qk > 128 || head_dim_v > "
             "128))'; training at 192 never joined it through TE 2.18 but for latent "
             "attention's 192/128), so its backend selection (get_attention_backend) takes "
             "FlashAttention-2, which it allows on sm100 for equal head dims <= 256 with "
             "flash-attn 2.7.3-2.7.4.post1 (version_required_blackwell); the container's "
             "flash-attn is assumed in that window (without it TE runs its unfused attention)")


def _te_kernel(shape: ModelShape, gpu: str) -> str:
    """The attention kernel Transformer Engine 2.1-2.4 picks for ``shape`` on ``gpu``, as the
    record states it: cuDNN's fused kernel (the planner's default, ``fa3``: no
    ``flash_kernel=`` key), except where it falls back to FlashAttention-2
    (:func:`shardlab.plan.options.te_falls_back`, :data:`_TE_SM100`). The rule is every
    row's; only Nemotron-4 340B (head dim 192) meets it, on GB200."""
    return " flash_kernel=fa2" if te_falls_back(shape, get_accelerator(gpu)) else ""


def _run(key: str, model: str, gpu: str, gpus: int, tp: int, pp: int, cp: int, vp: int,
         gbs: int, seq: int, step: float, table: str, config: str, role: str = "validation",
         graphs: bool = False, dtype: str = "bf16", mbs: int = 1) -> PublishedRun:
    shape = get_model("llama-3.1-405b") if model == "405b" else _NEMOTRON[model]
    split = fewer_at_ends(shape.layers, pp * vp, 1) if model == "405b" else None
    return PublishedRun(
        f"DGXC {key}" + (" FP8" if dtype == "fp8" else ""), f"{_SRC}, {gpu}", shape, gpu,
        gpus, tp, pp, gbs, seq, step, role,
        f"training step time {step} s (mean of iterations 11-44)", recompute="none",
        sp=tp > 1, zero=1, micro_batch=mbs, virtual=vp, flash=True, cp=cp,
        stage_layers=split or (), dtype=dtype,
        options="overlap_dp=1 overlap_tp=1 reduce_dtype=bf16 fused_loss=1"
        + (" fp8_params=1 fp8_recipe=delayed" if dtype == "fp8" else "")
        + _te_kernel(shape, gpu),
        assumed=(*(_GB200 if gpu == "GB200" else DGX_H100),
                 *((_TE_SM100,) if _te_kernel(shape, gpu) else ()),
                 *(("Transformer Engine's per-layer CUDA graphs (--cuda_graphs true) not "
                    "priced: the launches are charged as without them",) if graphs else ()),
                 *(("context parallel as Megatron-Core runs it (K/V around the cp ring, "
                    "priced as an all-gather of the same bytes)",) if cp > 1 else ())),
        checked=f"{table}; {config}; {_PRECISION[dtype]}; " + _SET)


_L_TABLE = "llama3.1/README.md layout row and 'Llama3.1 405b BF16' performance table"
_N_TABLE = "nemotron/README.md layout row and 'Nemotron 340b BF16 GB200' performance table"
_N_H100 = "nemotron/README.md layout row and 'Nemotron4 340b {} H100' performance table"
_L_CONF = ("launch.sh: -tp {tp} -pp 8 -cp 2 -vp 8 -mb 1 -gb {gbs}; llama31_405b.py "
           "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
           "True (1+2x62+1)")
_N_CONF = "launch.sh: -tp 8 -pp {pp} -cp 1 -vp 12 -mb 1 -gb {gbs}{graphs}; even split"
_L8_TABLE = "llama3.1/README.md layout row and 'Llama3.1 405b FP8' performance table"
_N15_TABLE = ("nemotron/README.md layout row '| 15b | BF16/FP8 | 16 | 4096 | 32 | 2 | 1 | 1 | NA "
              "| 8 | NA | 2 | 64 | 4 |' and 'Nemotron4 15b")
_N15_CONF = "launch.sh: -tp 2 -pp 1 -cp 1 -gb 64 -mb 2 (no -vp, no CUDA graphs)"

BF16_RUNS: tuple[PublishedRun, ...] = (
    _run("Llama3.1-405B GB200 128", "405b", "GB200", 128, 4, 8, 2, 8, 64, 8192, 9.347,
         f"{_L_TABLE}: '| 128 | 8192 | 126 | 0 | 4 | 8 | 2 | NA | NA | 2 | 8 | 1 | 64 | 32 |', "
         "'9.347' (47.4% MFU)", _L_CONF.format(tp=4, gbs=64)),
    _run("Llama3.1-405B GB200 256", "405b", "GB200", 256, 4, 8, 2, 8, 128, 8192, 9.484,
         f"{_L_TABLE}: '| 256 | 8192 | 126 | 0 | 4 | 8 | 2 | NA | NA | 4 | 8 | 1 | 128 | 32 "
         "|', '9.484' (46.7% MFU)", _L_CONF.format(tp=4, gbs=128), role="calibration"),
    _run("Llama3.1-405B GB200 512", "405b", "GB200", 512, 4, 8, 2, 8, 256, 8192, 9.508,
         f"{_L_TABLE}: '| 512 | 8192 | 126 | 0 | 4 | 8 | 2 | NA | NA | 8 | 8 | 1 | 256 | 32 "
         "|', '9.508' (46.6% MFU)", _L_CONF.format(tp=4, gbs=256)),
    _run("Llama3.1-405B H100 512", "405b", "H100 SXM", 512, 8, 8, 2, 8, 256, 8192, 19.810,
         f"{_L_TABLE} (H100, v25.05.05: GA 64): '| 512 | 8192 | 126 | 0 | 8 | 8 | 2 | NA | "
         "NA | 4 | 8 | 1 | 256 | 64 |', '19.810' (55.34% MFU)", _L_CONF.format(tp=8, gbs=256)),
    _run("Nemotron4-340B GB200 128", "340b", "GB200", 128, 8, 4, 1, 12, 32, 4096, 2.189,
         f"{_N_TABLE} (weak scaling): '| 340b | BF16/FP8 | 128 | 4096 | 96 | 8 | 4 | 1 | 12 | "
         "1 | 32 |4 | 8 |', '2.189' (40.2% MFU)",
         _N_CONF.format(pp=4, gbs=32, graphs=" -fsdp 0 --cuda_graphs true"), graphs=True),
    _run("Nemotron4-340B GB200 256", "340b", "GB200", 256, 8, 4, 1, 12, 64, 4096, 2.19,
         f"{_N_TABLE} (weak scaling): '| 340b | BF16/FP8 | 256 | 4096 | 96 | 8 | 4 | 1 | 12 | "
         "1 | 64 |8 | 8 |', '2.19' (40.2% MFU)",
         _N_CONF.format(pp=4, gbs=64, graphs=" -fsdp 0 --cuda_graphs true"), graphs=True),
    _run("Nemotron4-340B GB200 512", "340b", "GB200", 512, 8, 4, 1, 12, 128, 4096, 2.229,
         f"{_N_TABLE} (weak scaling): '| 340b | BF16/FP8 | 512 | 4096 | 96 | 8 | 4 | 1 | 12 | "
         "1 | 128 |16 | 8 |', '2.229' (39.4% MFU)",
         _N_CONF.format(pp=4, gbs=128, graphs=" -fsdp 0 --cuda_graphs true"), graphs=True),
    _run("Nemotron4-340B GB200 128 GBS512", "340b", "GB200", 128, 8, 4, 1, 12, 512, 4096,
         32.66, f"{_N_TABLE} (strong scaling): '| 340b | BF16/FP8 | 128 | 4096 | 96 | 8 | 4 | 1 "
         "| 12 | 1 | 512 | 4 | 128 |', '32.66' (43% MFU)",
         _N_CONF.format(pp=4, gbs=512, graphs=" -fsdp 0 --cuda_graphs true"), graphs=True),
    _run("Nemotron4-340B GB200 256 GBS512", "340b", "GB200", 256, 8, 4, 1, 12, 512, 4096,
         16.58, f"{_N_TABLE} (strong scaling): '| 340b | BF16/FP8 | 256 | 4096 | 96 | 8 | 4 | 1 "
         "| 12 | 1 | 512 | 8 | 64 |', '16.58' (42.4% MFU)",
         _N_CONF.format(pp=4, gbs=512, graphs=" -fsdp 0 --cuda_graphs true"), graphs=True),
    _run("Nemotron4-340B GB200 512 GBS512", "340b", "GB200", 512, 8, 4, 1, 12, 512, 4096,
         8.468, f"{_N_TABLE} (strong scaling): '| 340b | BF16/FP8 | 512 | 4096 | 96 | 8 | 4 | 1 "
         "| 12 | 1 | 512 | 16 | 32 |', '8.468' (41.5% MFU)",
         _N_CONF.format(pp=4, gbs=512, graphs=" -fsdp 0 --cuda_graphs true"), graphs=True),
    _run("Nemotron4-340B H100 256", "340b", "H100 SXM", 256, 8, 8, 1, 12, 64, 4096, 4.606,
         f"{_N_H100.format('BF16')}: '| 340b | BF16/FP8 | 256 | 4096 | 96 | 8 | 8 | 1 | NA | 4 "
         "| 12 | 1 | 64 | 16 |', '4.606' (47.3% MFU)", _N_CONF.format(pp=8, gbs=64, graphs="")),
    _run("Nemotron4-15B H100 16", "15b", "H100 SXM", 16, 2, 1, 1, 1, 64, 4096, 2.746,
         f"{_N15_TABLE} BF16 H100': '2.746' (56.7% MFU)", _N15_CONF, mbs=2),
)

FP8_RUNS: tuple[PublishedRun, ...] = (
    _run("Llama3.1-405B GB200 128", "405b", "GB200", 128, 4, 8, 2, 8, 64, 8192, 6.131,
         f"{_L8_TABLE}: the 128 layout row, '6.131' (36.1% MFU)", _L_CONF.format(tp=4, gbs=64),
         dtype="fp8"),
    _run("Llama3.1-405B GB200 256", "405b", "GB200", 256, 4, 8, 2, 8, 128, 8192, 6.183,
         f"{_L8_TABLE}: the 256 layout row, '6.183' (35.8% MFU)",
         _L_CONF.format(tp=4, gbs=128), dtype="fp8"),
    _run("Llama3.1-405B GB200 512", "405b", "GB200", 512, 4, 8, 2, 8, 256, 8192, 6.244,
         f"{_L8_TABLE}: the 512 layout row, '6.244' (35.5% MFU)",
         _L_CONF.format(tp=4, gbs=256), dtype="fp8"),
    _run("Llama3.1-405B H100 512", "405b", "H100 SXM", 512, 8, 8, 2, 8, 256, 8192, 13.020,
         f"{_L8_TABLE} (H100): the 512 layout row (GA 64), '13.020' (42.12% MFU)",
         _L_CONF.format(tp=8, gbs=256), dtype="fp8"),
    *(_run(f"Nemotron4-340B GB200 {n}", "340b", "GB200", n, 8, 4, 1, 12, n // 4, 4096, t,
           f"{_N_TABLE.replace('BF16', 'FP8')} (weak scaling, GBS {n // 4}): '{t}'",
           _N_CONF.format(pp=4, gbs=n // 4, graphs=" -fsdp 0 --cuda_graphs true"),
           graphs=True, dtype="fp8")
      for n, t in ((128, 1.483), (256, 1.517), (512, 1.549))),
    *(_run(f"Nemotron4-340B GB200 {n} GBS512", "340b", "GB200", n, 8, 4, 1, 12, 512, 4096, t,
           f"{_N_TABLE.replace('BF16 GB200', 'FP8 GB200 Strong Scaling')} (GBS 512): '{t}'",
           _N_CONF.format(pp=4, gbs=512, graphs=" -fsdp 0 --cuda_graphs true"),
           graphs=True, dtype="fp8")
      for n, t in ((128, 21.83), (256, 11.21), (512, 5.668))),
    _run("Nemotron4-340B H100 256", "340b", "H100 SXM", 256, 8, 8, 1, 12, 64, 4096, 3.107,
         f"{_N_H100.format('FP8')}: '3.107' (35% MFU)",
         _N_CONF.format(pp=8, gbs=64, graphs=""), dtype="fp8"),
    _run("Nemotron4-15B H100 16", "15b", "H100 SXM", 16, 2, 1, 1, 1, 64, 4096, 1.988,
         f"{_N15_TABLE} FP8 H100': '1.988' (39.1% MFU)", _N15_CONF, mbs=2, dtype="fp8"),
)

_G_LAYOUT = ("'| 128 | 8192 | 64 | 4 | 1 | 1 | 8 | 4 | 32 | 1 | 1 | 256 | 8 |' (256, 512: DP 64, "
             "128, GBS 512, 1024)")
_G_H100 = "'| 512 | 8192 | 64 | 4 | 8 | 2 | 8 | 1 | 8 | 8 | 1 | 1024 | 128 |'"

GROK_RUNS: tuple[PublishedRun, ...] = (
    *(_grok("GB200", n, t, "bf16", f"layout {_G_LAYOUT}, 'Grok1 314b BF16' '{t}'")
      for n, t in ((128, 7.325), (256, 7.39), (512, 7.324))),
    *(_grok("GB200", n, t, "fp8", f"layout {_G_LAYOUT}, 'Grok1 314b FP8' '{t}'")
      for n, t in ((128, 5.298), (256, 5.224), (512, 5.193))),
    _grok("H100 SXM", 512, 15.933, "bf16", f"H100 layout {_G_H100}, 'Grok1 314b BF16' "
          "'15.933' (v25.05.02 on; 16.930 in v25.05.01)"),
    _grok("H100 SXM", 512, 13.433, "fp8", f"H100 layout {_G_H100}, 'Grok1 314b FP8' '13.433' "
          "(v25.05.02 on; 13.454 in v25.05.01)"),
)

DGXC_RUNS: tuple[PublishedRun, ...] = BF16_RUNS + FP8_RUNS + GROK_RUNS
