"""Published runs from papers: the calibration runs of the A100 and H100 curves and the
paper runs held out beside them.

* NAR21: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM" (SC21, arXiv 2104.04473), Table 1: GPT models, vocabulary
  51,200, sequence 2048, A100 80GB (Selene: 8 per node, 8 HDR 200G NICs per node),
  full activation recompute; TFLOP/s per GPU counted with 96·B·s·L·h²·(1 + s/6h +
  V/16Lh) (their Sec. 5.1, recompute included). Checked against a row-by-row
  transcription of Table 1 and the abstract (``_NAR21_CHECKED``).
* KOR22: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models" (arXiv 2205.05198), Tables 3 and 5: iteration times with full
  recompute and with selective recompute + sequence parallelism, data parallel 1. The
  selective column is checked against the Megatron-LM README's MFU table.
* MLM21: the Megatron-LM README's "GPT-3 Example" (commit 152aab30, January 2021) and its
  ``examples/pretrain_gpt3_175B.sh``: GPT-3 175B on 1024 A100, tp 8, pp 16, micro-batch 1,
  batch 1536, fp16, activations checkpointed, "each iteration takes around 32 seconds
  resulting in 138 teraFLOPs per GPU".
* MTNLG: Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG
  530B" (arXiv 2201.11990), Sec. 2.4: iteration times at 280, 350 and 420 DGX A100
  nodes, batch 1920, sequence 2048.
* LLAMA3: Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4:
  Llama 3.1 405B on H100, sequence 8192, 16M tokens per batch, TFLOP/s per GPU (checked
  against transcriptions of Table 4), with Sec. 3.3.2's pipeline: the first and the last
  stage one layer fewer.
* MS: Jiang et al. 2024, "MegaScale: Scaling Large Language Model Training to More Than
  10,000 GPUs" (NSDI 2024, arXiv 2402.15627), Table 2, the Megatron-LM baseline rows:
  GPT-175B with 128 heads and vocabulary 64,000, sequence 2048, tp 8, pp 8, interleaved
  with 6 chunks, on up to 12,288 Ampere GPUs (8 x 200G RoCE NICs per node).
* BL: BigScience BLOOM-176B, bigscience-workshop/bigscience ``train/tr11-176B-ml``
  (README and slurm script): 384 A100 80GB, tp 4, pp 12, dp 8, a logged production
  iteration.
* BBG: Wu et al. 2023, "BloombergGPT: A Large Language Model for Finance" (arXiv
  2303.17564), Sec. 3 and Table 4: a 50.6B BLOOM-style model on 64 p4d.24xlarge (512 A100
  40GB), ZeRO-3 sharded over 128 GPUs with 4 copies (MiCS), every layer checkpointed,
  102 TFLOP/s and 32.5 s per step.
"""

from __future__ import annotations

from shardlab.config.catalog import get_model
from shardlab.config.model import ModelShape
from shardlab.estimate.flops import flops_per_token, narayanan_full_recompute_flops
from shardlab.plan.choices import fewer_at_ends
from shardlab.plan.published_run import PublishedRun, megatron_flops


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelShape:
    return ModelShape(name, layers, hidden, heads, vocab=51200, context=2048, style="gpt",
                      tied=True)


_MEGATRON_2021 = ("micro-batch 1", "non-interleaved 1F1B", "gradient all-reduce not overlapped "
                  "with backward (Megatron-LM 2021)", "fp16 mixed precision (gradients "
                  "all-reduced in fp16)")


_NAR21_CHECKED = (
    "Table 1 as transcribed row by row in SotaroKaneda/MLCarbon data/megatron_table.csv (heads, "
    "hidden, layers, tp, pp, GPUs, batch, TFLOP/s, % of peak, aggregate PFLOP/s; internally "
    "consistent); independently, the abstract gives 502 PFLOP/s on 3072 GPUs (52% of peak) for "
    "1T, and a summary of the paper 148 TFLOP/s / 47% / 227 PFLOP/s on 1536 GPUs and 44% at 32 "
    "GPUs; the README's text gives vocabulary 51,200 and sequence 2048. The table itself is an "
    "image in the Megatron-LM README and the paper's text was not reachable")


def _nar21(name: str, layers: int, hidden: int, heads: int, tp: int, pp: int, gpus: int,
           batch: int, tflops: float, role: str) -> PublishedRun:
    m = _gpt(name, layers, hidden, heads)
    step = narayanan_full_recompute_flops(batch, 2048, layers, hidden, 51200) / (gpus * tflops
                                                                                 * 1e12)
    return PublishedRun(f"NAR21 {name}", "Narayanan et al. 2021, Table 1", m, "A100 SXM 80GB",
                        gpus, tp, pp, batch, 2048, step, role,
                        f"{tflops:g} TFLOP/s per GPU (96BsLh² formula)", dtype="fp16",
                        assumed=_MEGATRON_2021, checked=_NAR21_CHECKED)


def _mlm21() -> PublishedRun:
    """The Megatron-LM README's GPT-3 175B example of January 2021 (module docstring)."""
    check = narayanan_full_recompute_flops(1536, 2048, 96, 12288, 51200) / (1024 * 32.0 * 1e12)
    return PublishedRun(
        "MLM21 GPT-3 175B 1024 GPUs", "Megatron-LM README, GPT-3 Example (152aab30, Jan 2021)",
        _gpt("175B", 96, 12288, 96), "A100 SXM 80GB", 1024, 8, 16, 1536, 2048, 32.0,
        "validation", "'each iteration takes around 32 seconds resulting in 138 teraFLOPs "
        "per GPU'", dtype="fp16",
        assumed=("A100 80GB on Selene, as Narayanan et al. 2021 ran there months later (the "
                 "README says '1024 A100 GPUs')", "non-interleaved 1F1B (the only schedule "
                 "of that commit)", "gradient all-reduce not overlapped with backward "
                 "(Megatron-LM 2021)", "fp16 gradients all-reduced in fp16",
                 "vocabulary 51,200 (GPT-2's 50,257 padded to a multiple of 128 x tp)"),
        checked=f"README.md at 152aab30: 'It uses 8-way and 16-way tensor and pipeline "
        f"parallelism', 'global-batch-size 1536', 'each iteration takes around 32 seconds "
        f"resulting in 138 teraFLOPs per GPU which is 44% of the theoretical peak FLOPs'; "
        f"examples/pretrain_gpt3_175B.sh at that commit: 128 nodes x 8, --num-layers 96 "
        f"--hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --micro-batch-size 1 "
        f"--fp16 --checkpoint-activations; the 96BsLh² formula gives {check:.1f} TFLOP/s for "
        f"32 s")


def _kor22(name: str, layers: int, hidden: int, heads: int, pp: int, gpus: int, batch: int,
           full_s: float, selective_s: float, readme_mfu: float,
           role: str) -> list[PublishedRun]:
    m = _gpt(name, layers, hidden, heads)
    common = {"model": m, "gpu": "A100 SXM 80GB", "gpus": gpus, "tp": 8, "pp": pp,
              "global_batch": batch, "seq": 2048,
              "source": "Korthikanti et al. 2022, Tables 3 and 5",
              "assumed": ("micro-batch 1", "non-interleaved 1F1B")}
    mfu = 72 * batch * layers * 2048 * hidden**2 * (1 + 2048 / (6 * hidden)
                                                    + 51200 / (12 * hidden * layers))
    mfu /= selective_s * gpus * 312e12
    return [PublishedRun(f"KOR22 {name} full", measured_step=full_s, recompute="full",
                         measured_from=f"iteration time {full_s} s", role="unverified",
                         checked="NOT checked: the full-recompute column of Table 5 was not "
                         "reachable (only the selective column's MFU is, in the Megatron-LM "
                         "README)", **common),
            PublishedRun(f"KOR22 {name} selective+SP", measured_step=selective_s,
                         recompute="selective", sp=True,
                         measured_from=f"iteration time {selective_s} s", role=role,
                         checked=f"the Megatron-LM README's MFU table (data parallel 1, "
                         f"72BLsh²(1 + s/6h + V/12hL) model FLOPs) gives {readme_mfu:.1%}; this "
                         f"row's shape, batch and time give {mfu:.1%}", **common)]


def _mtnlg(nodes: int, step: float) -> PublishedRun:
    return PublishedRun(f"MTNLG 530B {nodes} nodes", "Smith et al. 2022, Sec. 2.4",
                        _gpt("mt-nlg-530b", 105, 20480, 128), "A100 SXM 80GB", nodes * 8, 8, 35,
                        1920, 2048, step, "validation", f"iteration time {step} s",
                        assumed=(*_MEGATRON_2021[:3], "bf16 mixed precision, gradients "
                                 "all-reduced in fp32 (Megatron's bf16 rule)"),
                        checked="times 60.1/50.2/44.4 s and 126/121/113 TFLOP/s per GPU at "
                        "batch 1920 on 280/350/420 DGX A100 nodes, as quoted from Sec. 2.4 by "
                        "the llm-analysis project (cli99/llm-analysis, examples/megatron-turing-"
                        "nlg); the 96BsLh² formula turns each time into its TFLOP/s within 1%",
                        excluded="inconsistent with KOR22 530B on the same model, layout and "
                        "GPUs: 0.25 s per micro-batch against 0.175 s (a production run on "
                        "DeepSpeed's pipeline engine, not Megatron's benchmark)")


def _llama3(gpus: int, tflops: float, role: str) -> PublishedRun:
    m = get_model("llama-3.1-405b")
    tokens = 2048 * 8192
    step = flops_per_token(m, 8192).train * tokens / (gpus * tflops * 1e12)
    return PublishedRun(f"LLAMA3 405B {gpus} GPUs", "Dubey et al. 2024, Table 4", m,
                        "H100 SXM", gpus, 8, 16, 2048, 8192, step, role,
                        f"{tflops:g} TFLOP/s per GPU (shardlab's model FLOPs)",
                        recompute="none", sp=True, zero=1, virtual=4, flash=True,
                        framework=None, stage_layers=fewer_at_ends(m.layers, 16 * 4, 1),
                        assumed=("micro-batch 1", "interleaved 1F1B with 4 chunks per rank",
                                 "ZeRO-1", "no recompute", "sequence parallel",
                                 "Meta's FLOP count = shardlab's (full s x s attention)",
                                 "'we reduce one Transformer layer each from the first and the "
                                 "last stages' (Sec. 3.3.2) with 4 chunks per rank: the first "
                                 "and the last chunk 1 layer, the other 62 chunks 2 (ranks 0 "
                                 "and 15 hold 7 layers, the others 8)"),
                        checked="Table 4 (p. 10) as transcribed from the PDF in several public "
                        "copies of the paper: 8,192 GPUs TP 8, CP 1, PP 16, DP 64, sequence 8,192, "
                        "batch 32 per DP group, 16M tokens, 430 TFLOP/s, 43% BF16 MFU; 16,384 "
                        "GPUs DP 128, batch 16 per DP group, 400 TFLOP/s, 41%; Sec. 3.3.2 gives "
                        "the 38-43% MFU range; Sec. 3.3.2: 'To balance the pipeline, we "
                        "reduce one Transformer layer each from the first and the last stages, "
                        "respectively' (read in the paper's text through the search index). "
                        "Table 4's DP is FSDP: which ZeRO stage it matches is assumed")


PAPER_RUNS: tuple[PublishedRun, ...] = (
    _nar21("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, "calibration"),
    _nar21("3.6B", 30, 3072, 32, 2, 1, 64, 512, 138, "validation"),
    _nar21("7.5B", 36, 4096, 32, 4, 1, 128, 512, 142, "calibration"),
    _nar21("18.4B", 40, 6144, 48, 8, 1, 256, 1024, 135, "validation"),
    _nar21("39.1B", 48, 8192, 64, 8, 2, 512, 1536, 138, "calibration"),
    _nar21("76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 140, "validation"),
    _nar21("145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 148, "calibration"),
    _nar21("310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 155, "validation"),
    _nar21("529.6B", 105, 20480, 128, 8, 35, 2520, 2520, 163, "calibration"),
    _nar21("1008.0B", 128, 25600, 160, 8, 64, 3072, 3072, 163, "validation"),
    *_kor22("22B", 48, 6144, 64, 1, 8, 4, 1.42, 1.10, 0.415, "calibration"),
    *_kor22("175B", 96, 12288, 96, 8, 64, 64, 18.13, 13.75, 0.514, "validation"),
    *_kor22("530B", 105, 20480, 128, 35, 280, 280, 49.05, 37.83, 0.560, "calibration"),
    *_kor22("1T", 128, 25600, 160, 64, 512, 512, 94.42, 71.49, 0.563, "validation"),
    _mtnlg(280, 60.1),
    _mtnlg(350, 50.2),
    _mtnlg(420, 44.4),
    _llama3(8192, 430, "calibration"),
    _llama3(16384, 400, "validation"),
)



_MS_MODEL = ModelShape("gpt-175b-128h", 96, 12288, 128, vocab=64000, context=2048,
                       style="gpt", tied=True,
                       source="MegaScale Table 1: 128 heads, hidden 12288, 96 layers; Sec. 6.1: "
                       "vocabulary 64,000, sequence 2,048")
_MS_CHECKED = (
    "Table 2 of arXiv 2402.15627v1 as transcribed (search index id 61225413316): Megatron-LM "
    "rows 'batch 768: 256 512 768 1024 GPUs | 40.0 21.2 15.2 11.9 s | MFU 53.0% 49.9% 46.7% "
    "44.7%' and 'batch 6144: 3072 6144 8192 12288 | 29.02 14.78 12.24 8.57 s | 48.7% 47.8% "
    "43.3% 41.2%'; Megatron-LM's FLOP formula with a 312 TFLOP/s peak turns each time into "
    "its printed MFU within 0.2 points (A100)")


def _ms(gpus: int, batch: int, step: float, mfu: float) -> PublishedRun:
    return PublishedRun(
        f"MS {gpus} GPUs", "Jiang et al. 2024 (MegaScale), Table 2, Megatron-LM rows",
        _MS_MODEL, "A100 SXM 80GB", gpus, 8, 8, batch, 2048, step, "validation",
        f"iteration time {step} s (MFU {mfu}%)", recompute="selective", sp=True, virtual=6,
        flash=False,
        assumed=("A100 80GB SXM (the paper says Ampere; 175B on pp 8 needs 80 GB)",
                 "micro-batch 1", "sequence parallel and selective recompute",
                 "no distributed optimizer and no gradient-reduce overlap (Megatron-LM "
                 "defaults of commit 285068c8)", "tied embeddings (Megatron's default)",
                 "8 x 200G NICs per node, one per GPU (stated: eight 200G NICs)"),
        checked=_MS_CHECKED)


_BLOOM = ModelShape("bloom-176b", 70, 14336, 112, vocab=250880, context=2048, style="gpt",
                    tied=True, source="bigscience tr11-176B-ml: NHIDDEN=14336 NLAYERS=70 "
                    "NHEADS=112, --pad-vocab-size-to 250880, tied embeddings")


def _bloom() -> PublishedRun:
    check = megatron_flops(2048, 2048, 70, 14336, 250880) / (104.70 * 384 * 1e12)
    return PublishedRun(
        "BL 176B 384 GPUs", "BigScience BLOOM-176B, train/tr11-176B-ml README + slurm",
        _BLOOM, "A100 SXM 80GB", 384, 4, 12, 2048, 2048, 104.70, "validation",
        "logged 'elapsed time per iteration (s): 104.70' at iteration 85376",
        recompute="full", zero=1, micro_batch=2, framework="deepspeed", nics_per_node=4,
        nic_gbps=100,
        assumed=("4 Omni-Path links per node at 100 Gb/s each (the speed is not stated)",
                 "DeepSpeed pipeline engine, non-interleaved 1F1B", "ZeRO-1 (the bf16 "
                 "optimizer's own stage-1 equivalent)", "no flash attention (2022): the "
                 "scores are materialised", "ALiBi and the embedding LayerNorm priced as "
                 "gpt style's learned positions (a few million parameters)"),
        checked=f"README: 'TP=4 PP=12 DP=8 MBS=2', log line 'elapsed time per iteration (s): "
        f"104.70 | global batch size: 2048 | TFLOPs: 149.77'; Megatron's model-FLOP formula "
        f"gives {check:.1f} TFLOP/s for that time, x 4/3 (recompute counted, the README's "
        f"4·2 coefficient) = {check * 4 / 3:.1f} against the logged 149.77")


_BBG = ModelShape("bloomberggpt-50b", 70, 7680, 40, vocab=131072, context=2048,
                  style="gpt", tied=True, source="Wu et al. 2023 Table 4 (70 layers, 40 "
                  "heads, hidden 7,680, vocabulary 131,072), Sec. 3.1 (GELU MLP of 4D, tied "
                  "input and output embeddings), Sec. 3.3 (sequence 2,048)")


def _bloomberg() -> PublishedRun:
    # The paper's 102 TFLOP/s is 8 x 50.6B FLOPs per token (forward recomputed) of a
    # 2,048 x 2,048-token step in 32.5 s on 512 GPUs: the step the time is quoted for.
    per_token = 102e12 * 512 * 32.5 / (2048 * 2048) / 50.56e9
    return PublishedRun(
        "BBG 50B 512 GPUs", "Wu et al. 2023 (BloombergGPT), Sec. 3.4 and Table 4",
        _BBG, "A100 SXM 40GB", 512, 1, 1, 2048, 2048, 32.5, "validation",
        "'we achieve 102 TFLOPs on average and each training step takes 32.5 seconds'",
        recompute="full", zero=3, micro_batch=4, dp_replicate=4, framework="deepspeed",
        nics_per_node=4, nic_gbps=100,
        assumed=("no tensor or pipeline parallelism (only ZeRO-3 sharding is described)",
                 "micro-batch 4: the 4 sequences each GPU takes per step in one pass, no "
                 "accumulation (the split is not stated; 18.4 GiB by the planner's count; "
                 "ZeRO-3 gathers the weights once per micro-batch, so 1 or 2 would be slower)",
                 "ZeRO-3 gathers and reduce-scatters in bf16 (the paper stores parameters in "
                 "FP32; fp32 gathers would double the 7.9 s of collectives, not priced)",
                 "global batch 2,048 (the batch after the first 7,200 of 139,200 steps; "
                 "102 TFLOP/s x 512 GPUs x 32.5 s over its 4.2M tokens is "
                 f"{per_token:.2f} x 50.6B FLOPs per token, 6N and a recomputed forward)",
                 "SageMaker's sharded data parallelism priced as DeepSpeed ZeRO-3 (MiCS: "
                 "each copy's 128 GPUs a shard group, the 4 copies replicas)",
                 "p4d.24xlarge's 400 Gb/s EFA as 4 NICs of 100 Gb/s (AWS's instance "
                 "specification; only the total enters the model)",
                 "no flash attention: Megatron's masked-causal-softmax fused kernel over "
                 "materialised scores", "ALiBi and the embedding LayerNorm priced as gpt "
                 "style's learned positions"),
        checked="Sec. 3.4 read in the paper's text (arXiv 2303.17564v3 through the search "
        "index): 'stage 3 of ZeRO', 'We shard a model across 128 GPUs, and we have 4 copies "
        "of the model during training', 'We apply activation checkpointing to each "
        "transformer layer', BF16 forward and backward with FP32 parameters; Sec. 3.3: 64 "
        "p4d.24xlarge, 8 x 40GB A100 each, NVSwitch, EFA 400 Gb/s; Table 4: 32.5 sec/step, "
        "avg. 102 TFLOPs; Table 4's 50.6B and App. A.5's 50,558,868,480 parameters within "
        "0.03% of the shape's count (gpt style adds 2,048 x 7,680 learned positions)")


PAPER_RUNS = (
    *PAPER_RUNS,
    _ms(256, 768, 40.0, 53.0), _ms(512, 768, 21.2, 49.9), _ms(768, 768, 15.2, 46.7),
    _ms(1024, 768, 11.9, 44.7), _ms(3072, 6144, 29.02, 48.7), _ms(6144, 6144, 14.78, 47.8),
    _ms(8192, 6144, 12.24, 43.3), _ms(12288, 6144, 8.57, 41.2), _bloom(),
    _bloomberg(), _mlm21(),
)
