"""Published runs of FlashAttention's own training code: small GPT models on one node.

* FA: Dao-AILab/flash-attention ``training/README.md`` (the results added in 4a6eaa9f,
  "Update configs, add results", 2022-11-29): GPT3 125M-2.7B at sequence 2048 on "one node
  with 8 x A100 80GB SXM4 80GB (400W) with NVLink", bf16, FlashAttention-1 (flash-attn
  0.2.2 in NGC 22.11), total tokens/s of the node; each row's experiment config
  (``training/configs/experiment/pile/gpt3*-flash.yaml`` at that commit) gives the shape,
  the per-GPU micro-batch, the global batch and the strategy (DDP with Apex FusedAdam up to
  355M, PyTorch's ZeroRedundancyOptimizer from 760M), fused dense, MLP and
  dropout-add-LayerNorm kernels, Apex's fused cross-entropy, no activation checkpointing.
* LFA: LambdaLabsML/examples ``flash-attention-2/README.md`` (9dc2e06b, Aug 2023), the same
  code with FlashAttention-2 (flash-attn 2.0.0.post1, NGC 22.12) from the fork
  LambdaLabsML/flash-attention (5bc27152): GPT3-2.7B with head dimension 80 at sequence
  1024, fp16, micro-batch 4, global batch 512, ZeRO-1, on 8 A100 80GB SXM4 and 8 H100
  80GB SXM5 (the one-GPU rows of the same configuration are left out); "Tokens/Sec, which
  is calculated as Iter/Sec x max_length x batch_size" (the total over the GPUs).
"""

from __future__ import annotations

from shardlab.config.model import ModelShape
from shardlab.plan.published_run import PublishedRun, tokens_step

_VOCAB = 50264
"""GPT-2's 50,257 tokens padded to a multiple of 8 (``pad_vocab_size_multiple: 8``)."""


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int) -> ModelShape:
    return ModelShape(name, layers, hidden, heads, vocab=_VOCAB, context=seq, style="gpt",
                      tied=True, source="flash_attn.models.gpt.GPTLMHeadModel over a "
                      "transformers GPT2Config (learned positions, GELU MLP of 4h, tied "
                      "embeddings, LayerNorm); n_layer, n_embd, n_head from the experiment "
                      "config")


_FA_ASSUMED = (
    "DDP's bucketed all-reduce overlapped with backward (PyTorch Lightning's default "
    "strategy where the config sets none); ZeroRedundancyOptimizer priced as ZeRO-1",
    "the A100 80GB branch of the configs' micro-batch choice (train.gpu_mem >= 80)",
    "FlashAttention-1 at FlashAttention-2's share of the peak over Dao 2023's '1.7-3.0x' "
    "(flash_kernel=fa1)",
    "Apex's fused softmax cross-entropy priced as a fused loss", "dropout on (GPT2Config's "
    "default 0.1)")
_FA_CHECKED = (
    "training/README.md at 4a6eaa9f: 'We measure the wallclock training speed on one node with "
    "8 x A100 80GB SXM4 80GB (400W) with NVLink', the table 'GPT3-125M | 0.5M | 1310k', "
    "'355M | 0.5M | 503k', '760M | 0.5M | 245k', '1.3B | 1M | 169k', '2.7B | 1M | 85k' "
    "(tokens/sec of the node); Megatron's formula x 3/4 over these throughputs gives the "
    "README's chart bars (149, 167, 163, 189, 189 TFLOP/s per A100) within 0.6%; the "
    "pile/gpt3*-flash.yaml configs at that commit (trainer.devices 8, bf16, batch sizes, "
    "strategy, use_flash_attn, fused_bias_fc, fused_dense_gelu_dense, fused_dropout_add_ln, "
    "CrossEntropyLossApex)")


def _fa(size: str, layers: int, hidden: int, heads: int, micro: int, batch: int,
        node_tokens: float, zero: int) -> PublishedRun:
    return PublishedRun(
        f"FA GPT3-{size}", "FlashAttention training README (Nov 2022), 8 x A100 80GB",
        _gpt(f"gpt3-{size}", layers, hidden, heads, 2048), "A100 SXM 80GB", 8, 1, 1, batch,
        2048, tokens_step(batch, 2048, 8, node_tokens / 8), "validation",
        f"{node_tokens / 1e3:g}k tokens/s on 8 GPUs", recompute="none", zero=zero,
        micro_batch=micro, flash=True, framework=None,
        options="flash_kernel=fa1 fused_norm=1 fused_loss=1", assumed=_FA_ASSUMED,
        checked=_FA_CHECKED)


_LFA_ASSUMED = (
    "flash_kernel=fa2 (flash-attn 2.0.0.post1)", "fp16 mixed precision (precision 16)",
    "ZeroRedundancyOptimizer priced as ZeRO-1",
    "flash_attn.losses.cross_entropy.CrossEntropyLoss (the fork's owt/base.yaml) priced as a "
    "fused loss", "dropout on (GPT2Config's default 0.1)", "residual_in_fp32 (the fork's "
    "config) not priced", "Iter/Sec is the steady rate of the fork's 100-step run "
    "(trainer.max_steps 100, 10 warm-up steps; '2.5' has two significant figures)")
_LFA_CHECKED = (
    "flash-attention-2/README.md at 9dc2e06b, Tables 1 and 2: 'A100 80GB SXM4 FA2 | 2.6 | "
    "10649.6 | 4', 'H100 80GB SXM5 FA2 | 5.44 | 22282.24 | 4', '8xA100 80GB SXM4 FA2 | 2.5 | "
    "81920 | 4', '8xH100 80GB SXM5 FA2 | 5.34 | 174981.12 | 4' (Iter/Sec, Tokens/Sec, "
    "BS_per_GPU); Iter/Sec x 1024 x 4 x GPUs gives each Tokens/Sec; the fork's "
    "owt/gpt3-2.7B-flash.yaml (n_layer 32, n_embd 2560, n_head 32, batch_size 4, "
    "mlp_checkpoint_lvl 0) over gpt3xl-flash (global_batch_size 512, DDPStrategyZero1) over "
    "owt/base (precision 16, max_length 1024)")


def _lfa(gpu: str, gpus: int, total_tokens: float) -> PublishedRun:
    short = "A100" if gpu.startswith("A100") else "H100"
    return PublishedRun(
        f"LFA GPT3-2.7B {gpus}x{short}", "Lambda FlashAttention-2 benchmark (Aug 2023)",
        _gpt("gpt3-2.7b-hd80", 32, 2560, 32, 1024), gpu, gpus, 1, 1, 512, 1024,
        tokens_step(512, 1024, gpus, total_tokens / gpus), "validation",
        f"{total_tokens:g} tokens/s on {gpus} GPUs", recompute="none", zero=1,
        micro_batch=4, flash=True,
        dtype="fp16", framework=None, options="flash_kernel=fa2 fused_norm=1 fused_loss=1",
        assumed=_LFA_ASSUMED, checked=_LFA_CHECKED)


FLASH_RUNS: tuple[PublishedRun, ...] = (
    _fa("125M", 12, 768, 12, 32, 256, 1310e3, 0),
    _fa("355M", 24, 1024, 16, 32, 256, 503e3, 0),
    _fa("760M", 24, 1536, 16, 16, 256, 245e3, 1),
    _fa("1.3B", 24, 2048, 16, 8, 512, 169e3, 1),
    _fa("2.7B", 32, 2560, 20, 4, 512, 85e3, 1),
    # The README's one-GPU rows (10,649.6 and 22,282.24 tokens/s) are the same configuration
    # without the data-parallel all-reduce: left out so one measurement counts once.
    _lfa("A100 SXM 80GB", 8, 81920),
    _lfa("H100 SXM", 8, 174981.12),
)
