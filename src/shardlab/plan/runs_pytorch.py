"""Published runs from PyTorch-native stacks: torchtitan, MosaicML's llm-foundry (Composer
+ FSDP), IBM's fms-fsdp, NeMo AutoModel.

* TT: pytorch/torchtitan ``benchmarks/llama3_h100_202412_torchtitan.md`` (torchtitan
  9dec370, Dec 2024): Llama 3.1 8B/70B/405B, "Each H100 GPU is equipped with 96GB HBM2e
  with 2.4 TB/sec peak memory bandwidth", "400 Gb/s per GPU", "We used the default 500W
  power limit"; tokens/s per GPU at the 90th iteration.
* TA: pytorch/torchtitan ``benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md`` (June
  2025, same hosts): vanilla against async TP, bf16 against fp8 tensorwise.
* TT405: pytorch/torchtitan ``docs/performance.md`` at 3faaa1a0d (Aug 2024): Llama 3.1
  405B on 128 HBM2e H100s, FSDP 16 x TP 8, bf16, Float8, Float8 + async TP.
* TH: pytorch/torchtitan ``benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md``:
  Llama 3.1 8B on 32 and 64 H200, fp8 with fp8 FSDP all-gathers.
* MPT: mosaicml/llm-foundry ``scripts/train/benchmarking/README.md`` (commit 49521837):
  MPT models on A100 40/80GB and H100 with FSDP, tokens/s per GPU; each table's attention
  kernel and FSDP policy from the script that ran it (``_mpt``).
* IBM: foundation-model-stack/fms-fsdp ``README.md`` (commit ed74fd5d): Llama 2 with FSDP
  and torch.compile on 128 A100 ("400Gbps") and 96 H100 ("800 Gbps"), gradients reduced in
  bf16 (its ``bfSixteen`` policy).
* AM: NVIDIA-NeMo/Automodel ``docs/performance-summary.mdx`` (FSDP2 backend, bf16).
"""

from __future__ import annotations

from shardlab.config.catalog import get_model
from shardlab.config.model import ModelShape
from shardlab.plan.published_run import PublishedRun, tokens_step
from shardlab.plan.runs_nvidia import QWEN3_30B

_TT_HW = (("memory_bytes", 96e9), ("memory_bandwidth", 2.4e12))
_TT_ASSUMED = ("H100 SXM peaks under the stated 500 W cap (the file: 'the actual peak "
               "TFLOPs number is between SXM and NVL')", "sequence 8192 (the train_configs "
               "at the benchmark commit)", "global batch = local batch x data-parallel degree",
               "sequence parallel with tp > 1 (torchtitan always)", "one 400 Gb/s NIC per "
               "GPU (stated)")
# Said only of the rows they concern (a bf16 row has no fp8 scaling, a full-AC row no SAC).
_TT_FP8 = "fp8: tensorwise dynamic scaling with fp8 FSDP all-gathers"
_TT_SAC = "per-op selective activation checkpointing priced as selective recompute"
_TT_CHECKED = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (commit "
               "820504e2), table row and caption quoted in the run's measured_from")


def _tt(key: str, model: str, gpus: int, tp: int, pp: int, local: int, mb: int,
        recompute: str, tokens: float, row: str, dtype: str = "bf16", compiled: bool = True,
        options: str = "", virtual: int = 1, role: str = "validation",
        source: str = "torchtitan Llama 3.1 H100 benchmarks, Dec 2024",
        checked: str = _TT_CHECKED, memory: float | None = None) -> PublishedRun:
    dp = gpus // (tp * pp)
    gbs = local * dp
    return PublishedRun(
        f"{key}", source, get_model(model), "H100 SXM", gpus, tp, pp, gbs, 8192,
        tokens_step(gbs, 8192, gpus, tokens), role, f"{tokens:g} tokens/s per GPU ({row})",
        recompute=recompute, sp=tp > 1, zero=3, micro_batch=mb, virtual=virtual, flash=True,
        dtype=dtype, framework="torchtitan",
        options=f"fused_norm={int(compiled)} {options}".strip(),
        hardware=_TT_HW, power_cap_w=500, checked=checked, measured_memory_gib=memory,
        assumed=(*_TT_ASSUMED, *((_TT_FP8,) if dtype == "fp8" else ()),
                 *((_TT_SAC,) if recompute == "selective" else ())))


_TA = ("torchtitan async-TP benchmark, June 2025",
       "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (commit "
       "2887250b): 'Llama3 70b on 256 H100s with FSDP=32, TP=8, torch.compile, full AC, "
       "local batch size 16' / 'Llama3 8b on 64 H100s with FSDP=8, TP=8, torch.compile, per "
       "op SAC, local batch size 12' and their bfloat16 / float8 tensorwise rows; the loss "
       "compiled with the model at the benchmark's torchtitan 820504e (torchtitan/components/"
       "loss.py: 'if job_config.training.compile: ... loss_fn = torch.compile(loss_fn)'), "
       "priced as a fused loss (fused_loss=1)")


_T405 = ("torchtitan docs/performance.md, Aug 2024",
         "pytorch/torchtitan docs/performance.md at 3faaa1a0d (Aug 2024): 'Llama 3.1 (405B) "
         "on 128 H100 (94GB memory)', 'we only tested 2D parallelism (FSDP2 + Tensor "
         "Parallel)', 'local batch size 2 (global batch size = local batch size 2 * number "
         "of FSDP ranks 16 = 32)', footnote 'HBM2e based lower TDP SXM H100(95GB)' (the "
         "Dec 2024 file's hosts, 500 W assumed); no torch.compile named (eager norms and "
         "loss); sequence 8192 checked: 109 tokens/s x (6N + 12 L h s) over 989 TFLOP/s is "
         "the table's 29.0% MFU")


def _ta(key: str, model: str, gpus: int, local: int, recompute: str, tokens: float,
        dtype: str, async_tp: bool, role: str = "validation") -> PublishedRun:
    return _tt(key, model, gpus, 8, 1, local, local, recompute, tokens,
               f"{dtype}, {'async' if async_tp else 'vanilla'} TP", dtype=dtype,
               options=f"overlap_tp={int(async_tp)} fused_loss=1", role=role, source=_TA[0],
               checked=_TA[1])


TT_RUNS: tuple[PublishedRun, ...] = (
    _tt("TT-1 8B FSDP8 eager", "llama-3-8b", 8, 1, 1, 2, 2, "selective", 5762,
        "Table 1 'FSDP | 5,762'", compiled=False, memory=82.4),
    _tt("TT-2 8B FSDP8", "llama-3-8b", 8, 1, 1, 2, 2, "selective", 6667,
        "Table 1 'FSDP + torch.compile | 6,667'", role="calibration", memory=77.0),
    _tt("TT-3 8B FSDP8 fp8", "llama-3-8b", 8, 1, 1, 2, 2, "selective", 8532,
        "Table 1 'FSDP + torch.compile + Float8 | 8,532'", dtype="fp8", memory=76.8),
    _tt("TT-4 8B FSDP128 eager", "llama-3-8b", 128, 1, 1, 2, 2, "selective", 5605,
        "Table 3 'FSDP | 5,605'", compiled=False, memory=67.0),
    _tt("TT-5 8B FSDP128", "llama-3-8b", 128, 1, 1, 2, 2, "selective", 6514,
        "Table 3 'FSDP + torch.compile | 6,514'", memory=62.0),
    _tt("TT-6 8B FSDP128 fp8", "llama-3-8b", 128, 1, 1, 2, 2, "selective", 8380,
        "Table 3 'FSDP + torch.compile + Float8 | 8,380'", dtype="fp8", memory=61.8),
    _tt("TT-7 70B FSDP32 TP8 fp8", "llama-3-70b", 256, 8, 1, 16, 16, "full", 829,
        "Table 4 '2D | 829'", dtype="fp8", options="overlap_tp=0", memory=71.9),
    _tt("TT-8 70B FSDP32 TP8 fp8 async", "llama-3-70b", 256, 8, 1, 16, 16, "full", 876,
        "Table 4 '2D + AsyncTP | 876'", dtype="fp8", options="overlap_tp=1", memory=67.6),
    _tt("TT-9 405B 3D 1F1B fp8", "llama-3.1-405b", 512, 8, 8, 32, 4, "full", 100,
        "Table 5 '1F1B | 100'", dtype="fp8", options="overlap_tp=1", memory=82.5),
    _tt("TT-10 405B 3D interleaved fp8", "llama-3.1-405b", 512, 8, 8, 32, 4, "full", 128,
        "Table 5 'Interleaved 1F1B | 128' (2 chunks per rank assumed)", dtype="fp8",
        options="overlap_tp=1", virtual=2, memory=72.7),
    _ta("TA-1 70B bf16", "llama-3-70b", 256, 16, "full", 597.3, "bf16", False),
    _ta("TA-2 70B bf16 async", "llama-3-70b", 256, 16, "full", 652.4, "bf16", True),
    _ta("TA-3 70B fp8", "llama-3-70b", 256, 16, "full", 809.8, "fp8", False),
    _ta("TA-4 70B fp8 async", "llama-3-70b", 256, 16, "full", 942.4, "fp8", True),
    _ta("TA-5 8B bf16", "llama-3-8b", 64, 12, "selective", 4378, "bf16", False),
    _ta("TA-6 8B bf16 async", "llama-3-8b", 64, 12, "selective", 4809.4, "bf16", True),
    _ta("TA-7 8B fp8", "llama-3-8b", 64, 12, "selective", 5078.1, "fp8", False),
    _ta("TA-8 8B fp8 async", "llama-3-8b", 64, 12, "selective", 5570.1, "fp8", True),
    # Aug 2024: 405B on 128 of the same HBM2e H100s, FSDP 16 x TP 8, eager.
    *(_tt(f"TT405-{i} 405B FSDP16 TP8{label}", "llama-3.1-405b", 128, 8, 1, 2, 2, "full",
          tokens, f"'| 405B | 2 | full | {tokens} | {mfu} | {opts}'", dtype=dtype,
          compiled=False, options=f"overlap_tp={int(async_tp)}", source=_T405[0],
          checked=_T405[1])
      for i, (label, tokens, mfu, opts, dtype, async_tp) in enumerate((
          ("", 109, "29.0%[^1]", "None", "bf16", False),
          (" fp8", 177, "23.46%[^2]", "Float8", "fp8", False),
          (" fp8 async", 185, "24.52%", "Float8 + Async TP", "fp8", True)), start=1)),
)


_TT_CP_ASSUMED = ("H100 SXM peaks under the stated 500 W cap", "global batch = FSDP degree x "
                  "local batch 1 (not stated)", "one 400 Gb/s NIC per GPU (stated)",
                  _TT_FP8, "FSDP over dp x cp (torchtitan's dp_shard_cp mesh)", "torch's "
                  "context_parallel with load-balanced chunks, K/V priced as an all-gather")


def _tt_cp(key: str, fsdp: int, cp: int, seq: int, tokens: float, memory: float
           ) -> PublishedRun:
    """torchtitan's Table 2: Llama 3.1 8B on 8 GPUs, FSDP x CP, local batch 1, full AC."""
    return PublishedRun(
        f"TT-{key} 8B FSDP{fsdp} CP{cp} fp8", "torchtitan Llama 3.1 H100 benchmarks, Dec 2024",
        get_model("llama-3-8b"), "H100 SXM", 8, 1, 1, fsdp, seq,
        tokens_step(fsdp, seq, 8, tokens), "validation",
        f"{tokens:g} tokens/s per GPU (Table 2 'FSDP {fsdp}, CP {cp} | {seq} | {tokens:,}')",
        recompute="full", zero=3, flash=True, dtype="fp8", framework="torchtitan",
        options="fused_norm=1", cp=cp, hardware=_TT_HW, power_cap_w=500,
        assumed=_TT_CP_ASSUMED, measured_memory_gib=memory,
        checked=_TT_CHECKED + "; Table 2's caption: 'FSDP + CP + torch.compile + Float8. "
        "Llama 3.1 8B model. 8 GPUs. Local batch size 1. Full activation checkpointing.'")


TT_CP_RUNS: tuple[PublishedRun, ...] = (
    _tt_cp("11", 8, 1, 32768, 3890, 83.9),
    _tt_cp("12", 4, 2, 65536, 2540, 84.2),
    _tt_cp("13", 2, 4, 131072, 1071, 84.0),
    _tt_cp("14", 1, 8, 262144, 548, 84.5),
)


def _th(gpus: int, tokens: float, memory: float) -> PublishedRun:
    return PublishedRun(
        f"TH 8B FSDP{gpus} H200 fp8", "torchtitan community benchmark, Trainy on WhiteFiber",
        get_model("llama-3-8b"), "H200 SXM", gpus, 1, 1, 2 * gpus, 8192,
        tokens_step(2 * gpus, 8192, gpus, tokens), "validation",
        f"{tokens:g} tokens/s per GPU at the 100th iteration", recompute="selective", zero=3,
        micro_batch=2, flash=True, dtype="fp8", framework="torchtitan",
        options="fused_norm=1 fused_loss=1", measured_memory_gib=memory,
        assumed=("H200 SXM at 700 W (not stated)", "sequence 8192 and per-op selective "
                 "checkpointing from the 8B train config", "one 400 Gb/s NIC per GPU "
                 "(stated: 'Mellanox CX-7 per GPU')"),
        checked="pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md "
        "(commit 4a61bd87): rows '| 4 | 10938 | 47.96 |', '| 8 | 10753 | 46.97 |' (nodes, TPS "
        "per GPU, memory) and the command line (local batch 2, compile, float8 with fp8 FSDP "
        "all-gather); the loss compiled with the model at e7c0cae (torchtitan/components/"
        "loss.py build_cross_entropy_loss: 'if job_config.training.compile: ... loss_fn = "
        "torch.compile(loss_fn)'), priced as a fused loss")


def _mpt_model(size: str, layers: int, hidden: int, heads: int) -> ModelShape:
    return ModelShape(f"mpt-{size}", layers, hidden, heads, vocab=50368, context=2048,
                      style="gpt", tied=True, source=f"llm-foundry yamls/pretrain/mpt-{size}"
                      ".yaml (d_model, heads, layers, expansion 4, vocab 50368)")


_MPT = {"1b": _mpt_model("1b", 24, 2048, 16), "3b": _mpt_model("3b", 32, 2560, 20),
        "7b": _mpt_model("7b", 32, 4096, 32), "13b": _mpt_model("13b", 40, 5120, 40),
        "30b": _mpt_model("30b", 48, 7168, 56), "70b": _mpt_model("70b", 80, 8192, 64)}


# Which table each MPT row comes from decides its attention kernel and FSDP policy: the
# README's "H100 80GB BF16 (Large Scale)" table came with sweep.py (commit 5e85bd62, flash-attn
# 2.4.2 installed): "--attn_impl flash" for 1b, 3b, 7b and 70b, "--attn_impl triton" for 13b and
# 30b. The 8-64 GPU H100, the FP8 and the A100 80GB tables (commit b2a43a14) and the A100 40GB
# table (llm-foundry's first commit, 300cc5c5) came with sweep.sh, which passes no --attn_impl:
# submit_benchmarks.py's default, "parser.add_argument('--attn_impl', type=str,
# default='triton')". The README's "MP Mode" column is the run's fsdp_config mixed_precision
# (collect_results.py): DEFAULT everywhere but the A100 40GB table, PURE, which Composer's
# get_mixed_precision turns into reduce_dtype bf16 (DEFAULT leaves it unset: fp32, the
# framework's default here).
_MPT_KERNEL = {"flash": "fa2", "triton": "triton"}
# FSDP1's backward prefetch (plan/overlap.BACKWARD_PREFETCH): sweep.py's base_args (the one
# stored version, 76f5eeb6) pass it; sweep.sh passes none to submit_benchmarks.py, whose
# mod_parameters sets it only when given, and the pretrain yamls' fsdp_config name none, so
# Composer's FSDPConfig default holds.
_MPT_PREFETCH = {"large": "sweep.py's '--fsdp_config_backward_prefetch BACKWARD_PRE' (pre)",
                 "sweep": "none given (submit_benchmarks.py sets it only when passed; the "
                 "pretrain yamls' fsdp_config names none): Composer's FSDPConfig default "
                 "backward_prefetch 'BACKWARD_POST' (post)"}
_MPT_SWEEP = {"large": "sweep.py at commit 5e85bd62, --attn_impl {}",
              "sweep": "sweep.sh (no --attn_impl: submit_benchmarks.py's default triton)"}


def _mpt(key: str, size: str, gpus: int, gpu: str, mb: int, gbs: int, tokens: float,
         ckpt: bool, attn: str, zero: int = 3, dtype: str = "bf16", pure: bool = False,
         role: str = "validation") -> PublishedRun:
    table = "large" if gpus >= 128 and gpu == "H100 SXM" else "sweep"
    options = (f"flash_kernel={_MPT_KERNEL[attn]}" + (" reduce_dtype=bf16" if pure else "")
               + (" backward_prefetch=post" if table == "sweep" else ""))
    return PublishedRun(
        f"MPT-{key} {size}", "MosaicML llm-foundry benchmarking README", _MPT[size], gpu,
        gpus, 1, 1, gbs, 2048, tokens_step(gbs, 2048, gpus, tokens), role,
        f"{tokens:g} tokens/s per GPU", recompute="full" if ckpt else "none", zero=zero,
        micro_batch=mb, flash=True, dtype=dtype, framework="fsdp", options=options,
        assumed=("ALiBi and no biases priced as gpt style's learned positions and biases",
                 "Composer's FSDP1: forward gathers and reduce-scatters overlapped; the "
                 "backward gathers as its backward_prefetch says (checked)",
                 "8 GPUs per node, one 200 Gb/s (A100: '1600 Gbps node-node') or 400 Gb/s "
                 "(H100, not stated) NIC per GPU")
        # Only the rows whose table says activation checkpointing are priced with it.
        + (("activation checkpointing = full recompute of every block",) if ckpt else ())
        + (("fp8 through Transformer Engine ('amp_fp8'); its FSDP gathers bf16 weights, "
            "priced as fp8",) if dtype == "fp8" else ()),
        checked="README rows (model, seq 2048, GPUs, GPU type, MFU, HFU, micro-batch, grad "
        "accumulation, global batch, tokens/s per GPU, precision, MP Mode "
        f"{'PURE' if pure else 'DEFAULT'}, sharding, activation checkpointing) at "
        f"llm-foundry commit 49521837; attn_impl {attn} from "
        f"{_MPT_SWEEP[table].format(attn)}; backward_prefetch: " + _MPT_PREFETCH[table])


MPT_RUNS: tuple[PublishedRun, ...] = (
    _mpt("1", "70b", 512, "H100 SXM", 8, 4096, 1007, True, "flash"),
    _mpt("2", "70b", 256, "H100 SXM", 8, 2048, 1035, True, "flash"),
    _mpt("3", "70b", 128, "H100 SXM", 8, 1024, 1058, True, "flash"),
    _mpt("4", "30b", 128, "H100 SXM", 8, 1024, 2199, True, "triton"),
    _mpt("5", "7b", 512, "H100 SXM", 6, 3072, 9670, False, "flash"),
    _mpt("6", "7b", 128, "H100 SXM", 6, 768, 10475, False, "flash", role="calibration"),
    _mpt("7", "1b", 512, "H100 SXM", 12, 6144, 39837, False, "flash", zero=2),
    _mpt("8", "7b", 8, "H100 SXM", 6, 48, 10643, False, "triton"),
    _mpt("9", "13b", 8, "H100 SXM", 2, 16, 4792, False, "triton"),
    _mpt("10", "70b", 64, "H100 SXM", 8, 2048, 1039, True, "triton"),
    _mpt("11", "3b", 8, "H100 SXM", 10, 480, 30586, False, "triton", dtype="fp8"),
    _mpt("12", "70b", 64, "A100 SXM 80GB", 8, 2048, 410, True, "triton"),
    _mpt("13", "13b", 8, "A100 SXM 80GB", 2, 48, 2262, False, "triton"),
    _mpt("14", "7b", 8, "A100 SXM 80GB", 6, 96, 4641, False, "triton"),
    _mpt("15", "70b", 128, "A100 SXM 40GB", 4, 512, 376, True, "triton", pure=True),
    _mpt("16", "7b", 128, "A100 SXM 40GB", 18, 2304, 3623, True, "triton", pure=True),
    _mpt("17", "7b", 8, "A100 SXM 40GB", 12, 384, 3679, True, "triton", pure=True),
    _mpt("18", "1b", 8, "A100 SXM 40GB", 8, 512, 19271, False, "triton", pure=True),
)

# fms-fsdp at ed74fd5d: train_config.mixed_precision = True picks policies/mixed_precision.py's
# bfSixteen, "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
# buffer_dtype=torch.bfloat16)" (utils/train_utils.py get_policies): gradients reduced in bf16.
_IBM_REDUCE = ("fms-fsdp ed74fd5d fms_fsdp/policies/mixed_precision.py bfSixteen "
               "(reduce_dtype=torch.bfloat16), chosen by train_utils.get_policies for "
               "mixed_precision = True (config/training.py's default)")

_LLAMA2_34B = ModelShape("llama-2-34b", 48, 8192, 64, vocab=32000, context=4096, kv_heads=8,
                         d_ff=22016, style="llama", tied=False,
                         source="fms-fsdp fms_fsdp/utils/config_utils.py llama2_34b")


def _ibm(model: ModelShape, gpus: int, gpu: str, tokens: float, gbps: float) -> PublishedRun:
    size = model.name.split("-")[-1]
    step = tokens_step(2 * gpus, 4096, gpus, tokens)
    return PublishedRun(
        f"IBM {size} {gpus} {gpu.split()[0]}", "IBM fms-fsdp README", model, gpu, gpus, 1, 1,
        2 * gpus, 4096, step, "validation",
        f"{tokens:g} tokens/s per GPU", recompute="full", zero=3, micro_batch=2, flash=True,
        framework="fsdp", options="fused_norm=1 reduce_dtype=bf16", nics_per_node=2,
        nic_gbps=gbps / 2,
        assumed=(f"{gbps:g} Gb/s per node as 2 NICs of {gbps / 2:g} (the count is not "
                 "stated; only the total enters the model)", "'Selective AC' with fms-fsdp's "
                 "default selective_checkpointing = 1 (every block): full recompute",
                 "global batch = 2 x GPUs (no gradient accumulation)", "sequence 4096, "
                 "vocabulary 32,000 (training.py defaults)", "FSDP's ring gathers and "
                 "reduce-scatters leave each node over all its NICs (8 members per node: "
                 "shardlab.plan.comm_time), not over one GPU's eighth of them"),
        checked="README table rows '13b | FSDP | Y | Selective AC | 2 | 2150 | 4850', '34b "
        "... | 820 | 1830', '70b ... | 410 | 890' (A100 80G 128 GPUs with 400Gbps; H100 96 "
        "GPUs with 800 Gbps) at fms-fsdp commit ed74fd5d; gradients reduced in bf16: "
        + _IBM_REDUCE)


def _ibm_hsdp(gpus: int, gpu: str, tokens: float, gbps: float, row: str) -> PublishedRun:
    """fms-fsdp's 7B row: HSDP, each node's 8 GPUs a shard group ("will shard your model
    across 8 gpus in each node"), the nodes replicas; no activation checkpointing."""
    return PublishedRun(
        f"IBM 7b {gpus} {gpu.split()[0]} HSDP", "IBM fms-fsdp README", get_model("llama-2-7b"),
        gpu, gpus, 1, 1, 2 * gpus, 4096, tokens_step(2 * gpus, 4096, gpus, tokens),
        "validation", f"{tokens:g} tokens/s per GPU", recompute="none", zero=3,
        micro_batch=2, flash=True, framework="fsdp", options="fused_norm=1 reduce_dtype=bf16",
        dp_replicate=gpus // 8, nics_per_node=2, nic_gbps=gbps / 2,
        assumed=(f"{gbps:g} Gb/s per node as 2 NICs of {gbps / 2:g} (the count is not "
                 "stated; only the total enters the model)", "HSDP: FSDP inside each node "
                 "of 8, replicated across nodes", "global batch = 2 x GPUs (no gradient "
                 "accumulation)", "sequence 4096, vocabulary 32,000 (training.py defaults)"),
        checked=f"README table row '7b | HSDP | Y | No AC | 2 | 4550 | 9600' ({row}) and "
        "'HSDP ... will shard your model across 8 gpus in each node' at fms-fsdp commit "
        "ed74fd5d; gradients reduced in bf16: " + _IBM_REDUCE)


IBM_HSDP_RUNS: tuple[PublishedRun, ...] = (
    _ibm_hsdp(128, "A100 SXM 80GB", 4550, 400, "A100 80G 128 GPUs with 400Gbps"),
    _ibm_hsdp(96, "H100 SXM", 9600, 800, "H100 96 GPUs with 800 Gbps"),
)

IBM_RUNS: tuple[PublishedRun, ...] = (
    _ibm(get_model("llama-2-13b"), 128, "A100 SXM 80GB", 2150, 400),
    _ibm(_LLAMA2_34B, 128, "A100 SXM 80GB", 820, 400),
    _ibm(get_model("llama-2-70b"), 128, "A100 SXM 80GB", 410, 400),
    _ibm(get_model("llama-2-13b"), 96, "H100 SXM", 4850, 800),
    _ibm(_LLAMA2_34B, 96, "H100 SXM", 1830, 800),
    _ibm(get_model("llama-2-70b"), 96, "H100 SXM", 890, 800),
)

def _am_70b_cp2() -> PublishedRun:
    """NeMo AutoModel's Llama 3 70B row: FSDP 32 x CP 2 on 64 H100, 4 micro-batches."""
    # FSDP2 (reshard after forward, its default) gathers the bf16 weights in every
    # micro-batch's forward and backward and reduce-scatters the gradients over the 64-rank
    # dp x cp group, 8 members in each of 8 nodes: its rings leave each node over all 8 NICs.
    return PublishedRun(
        "AM Llama3-70B FSDP32 CP2", "NeMo AutoModel performance summary, DGX-H100 BF16",
        get_model("llama-3-70b"), "H100 SXM", 64, 1, 1, 128, 8192, 18.90, "validation",
        "time per global step 18.90 s (866.77 tokens/s per GPU)", recompute="full", zero=3,
        flash=True, framework="fsdp", options="fused_norm=1", cp=2,
        assumed=("full activation checkpointing (not stated; without it the activations of "
                 "80 layers exceed the 80 GB)", "FSDP over dp x cp (32 x 2)", "TE kernels: "
                 "fused norms", "context parallel priced as an all-gather of K and V"),
        checked="row 'Llama3 70B | 64 | 128 | 1 | 1 | 4 | 8192 | 1 | 1 | 2 | - | - | 32 | TE + "
        "fsdp2_prefetch | 18.90 | 389 | 866.77' (GPUs, GBS, MBS, LBS, GA, seq, TP, PP, CP, EP, "
        "VP, FSDP); 128 x 8192 / (64 x 18.90) = 866.9 tokens/s")

AM_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun(
        "AM Qwen3-30B-A3B FSDP8 EP8", "NeMo AutoModel performance summary, DGX-H100 BF16",
        QWEN3_30B, "H100 SXM", 8, 1, 1, 512, 4096, 21.773, "validation",
        "time per global step 21.773 s (12,040 tokens/s per GPU)", recompute="full", zero=3,
        micro_batch=4, flash=True, ep=8, etp=1, framework="fsdp",
        options="fused_norm=1 flash_kernel=fa3 dispatcher=flex routing=contiguous",
        checked="row 'Qwen3 MoE 30B | 8 | 512 | 4 | 4 | 16 | 4096 | 1 | 1 | 1 | 8 | - | 8 | TE "
        "+ DeepEP | 21.773 | 277 | 12,040' (GPUs, GBS, MBS, LBS, GA, seq, TP, PP, CP, EP, VP, "
        "FSDP); 512 x 4096 / (8 x 21.773) = 12,040 tokens/s; its config as the row was "
        "published (Automodel 8d9bfb90e, examples/benchmark/configs/qwen3_moe_30b_te_deepep."
        "yaml): parallelizer activation_checkpointing true (moe/parallelizer.py apply_ac wraps "
        "every block in checkpoint_wrapper: full recompute), backend attn te (Transformer "
        "Engine's DotProductAttention: cuDNN's fused attention on Hopper), linear te, "
        "rms_norm te, enable_deepep (GroupedExpertsDeepEP: Megatron's flex dispatcher on "
        "DeepEP, grouped_gemm ops.gmm), fake_balanced_gate (FakeBalancedGate: token i takes "
        "experts 8i..8i+7 mod 128), FSDP2 reduce_dtype float32"),
    _am_70b_cp2(),
)


PYTORCH_RUNS = (*TT_RUNS, *TT_CP_RUNS, _th(32, 10938, 47.96), _th(64, 10753, 46.97),
                *MPT_RUNS, *IBM_RUNS, *IBM_HSDP_RUNS, *AM_RUNS)
