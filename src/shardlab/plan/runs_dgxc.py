"""NVIDIA's DGX Cloud benchmarking recipes: bf16 on GB200 NVL72, with H100 twins.

DGXC: NVIDIA/dgxc-benchmarking, tags v25.05 to v25.05.05 (v25.05.05, c5c765f2, quoted;
the figures are the same in every v25.05.x tag, the H100 405B row from v25.05.01):
``llama3.1/README.md`` and ``nemotron/README.md`` give each run's layout table (TP, PP,
CP, VP, MBS, GBS, DP, GA) and its "Training step time (seconds per step)", the mean of
iterations 11-44 of a 50-step run on mock data (``common/parse_train_timing.sh``). The
runs launch NeMo 25.04's ``scripts/performance/llm/pretrain_llama31_405b.py`` and
``pretrain_nemotron4_340b.py`` (NeMo r2.3.0 branch ``llmb-nemo-r2.3.0``: 6f2c6fda for
Llama, b4148d21 for Nemotron; ``launch.sh`` gives the flags). What those set, as read:

* bf16 (``bf16_mixed``; no fp8), no recompute and no activation offload (no CSV row
  sets ``recompute_layers`` or ``activation_offload_layers`` for these GPU counts);
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
* GB200: 4 GPUs per tray, jobs in 16-tray (64-GPU) segments of NVL72 racks; H100: DGX
  H100, 8 per node, 8 x 400 Gb/s.

Role: the 405B on 256 GB200 is the Blackwell curve's **bf16 calibration run**, chosen as
the twin of its fp8 one (Megatron-Bridge's Llama 3.1 405B FP8 on 256 GB200,
:mod:`shardlab.plan.runs_blackwell`): same model, GPU and count. The rest are held out.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.config.catalog import get_model
from shardlab.plan.choices import fewer_at_ends
from shardlab.plan.published_run import PublishedRun
from shardlab.plan.runs_nvidia import _DGX, _NEMOTRON_340B

_SRC = "NVIDIA dgxc-benchmarking v25.05.x (NeMo 25.04)"
_SET = ("no recompute, no offload, no fp8 (set_primary_perf_configs with recompute_layers 0 "
        "and activation_offload_layers 0 for these GPU counts); distributed optimizer, "
        "overlap_grad_reduce and overlap_param_gather, grad_reduce_in_fp32 False (the "
        "plugin); cross_entropy_fusion_impl te; tp_comm_overlap True")
_GB200 = ("DGX GB200: 4 GPUs per tray, 4 x ConnectX-7 400 Gb/s per tray, NVL72 racks (the "
          "jobs run in 16-tray segments: one NVLink domain per 64 GPUs)",)
# NullTokenizer(256000) adds one token; Megatron pads to a multiple of 128 x TP (8).
_NEMOTRON = replace(_NEMOTRON_340B, vocab=257024)


def _run(key: str, model: str, gpu: str, gpus: int, tp: int, pp: int, cp: int, vp: int,
         gbs: int, seq: int, step: float, table: str, config: str, role: str = "validation",
         graphs: bool = False) -> PublishedRun:
    shape = get_model("llama-3.1-405b") if model == "405b" else _NEMOTRON
    split = fewer_at_ends(shape.layers, pp * vp, 1) if model == "405b" else ()
    return PublishedRun(
        f"DGXC {key}", f"{_SRC}, {gpu}", shape, gpu, gpus, tp, pp, gbs, seq, step, role,
        f"training step time {step} s (mean of iterations 11-44)", recompute="none",
        sp=tp > 1, zero=1, micro_batch=1, virtual=vp, flash=True, cp=cp, stage_layers=split or (),
        options="overlap_dp=1 overlap_tp=1 reduce_dtype=bf16 fused_loss=1",
        assumed=(*(_GB200 if gpu == "GB200" else _DGX),
                 *(("Transformer Engine's per-layer CUDA graphs (--cuda_graphs true) not "
                    "priced: the launches are charged as without them",) if graphs else ()),
                 *(("context parallel as Megatron-Core runs it (K/V around the cp ring, "
                    "priced as an all-gather of the same bytes)",) if cp > 1 else ())),
        checked=f"{table}; {config}; " + _SET)


_L_TABLE = "llama3.1/README.md layout row and 'Llama3.1 405b BF16' performance table"
_N_TABLE = "nemotron/README.md layout row and 'Nemotron4 340b BF16' performance table"
_L_CONF = ("launch.sh: -tp {tp} -pp 8 -cp 2 -vp 8 -mb 1 -gb {gbs}; llama31_405b.py "
           "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
           "True (1+2x62+1)")
_N_CONF = "launch.sh: -tp 8 -pp {pp} -cp 1 -vp 12 -mb 1 -gb {gbs}{graphs}; even split"

DGXC_RUNS: tuple[PublishedRun, ...] = (
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
         f"{_N_TABLE} (H100): '| 340b | BF16/FP8 | 256 | 4096 | 96 | 8 | 8 | 1 | NA | 4 | 12 "
         "| 1 | 64 | 16 |', '4.606' (47.3% MFU)", _N_CONF.format(pp=8, gbs=64, graphs="")),
)
