"""The planner's memory at a framework's peak (plan/memory_peak.py) and its validation
against published measured peaks (plan/published_memory.py)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from shardlab.config.catalog import get_model
from shardlab.config.dtypes import get_policy
from shardlab.estimate.activations import LOGIT_BYTES
from shardlab.estimate.partition import layer_params_per_tp_rank
from shardlab.plan.memory import MemoryOptions, memory_arrays
from shardlab.plan.memory_peak import (
    MemoryFacts,
    gathered_input_bytes,
    rank_layout,
    transient_bytes,
)
from shardlab.plan.overlap import FRAMEWORKS
from shardlab.plan.published_memory import memory_errors, memory_runs, memory_table
from shardlab.plan.search import layout_candidates
from shardlab.plan.space import Space

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"


def _one(model_name: str, gpus: int, batch: int, seq: int, layout: str, policy: str,
         opt: MemoryOptions) -> object:
    model = get_model(model_name)
    c = layout_candidates(model, Space(gpus=gpus, global_batch=batch, seq=seq), layout)
    return memory_arrays(model, c, seq, get_policy(policy), opt)


def test_without_facts_nothing_is_added() -> None:
    lay = "dp=8 tp=1 pp=1 micro_batch=2 zero=3 recompute=full"
    mem = _one("llama-3-8b", 8, 16, 8192, lay, "bf16", MemoryOptions(False, True))
    assert mem.transient[0] == 0.0


def test_loss_working_set_is_the_framework_bytes_per_logit_beyond_the_held_fp32() -> None:
    model = get_model("llama-3-8b")
    lay = "dp=1 tp=1 pp=1 micro_batch=2 zero=0 recompute=none"
    base = MemoryFacts(loss_bytes=LOGIT_BYTES)
    heavy = replace(base, loss_bytes=12.0)
    got = [_one("llama-3-8b", 1, 2, 8192, lay, "bf16", MemoryOptions(False, True, facts=f))
           for f in (base, heavy)]
    logits = 2 * 8192 * model.vocab
    # No recompute and no ZeRO-3: the loss's extra 8 B per logit is the whole transient.
    assert got[0].transient[0] == 0.0
    assert got[1].transient[0] == pytest.approx(8.0 * logits, rel=1e-12)


def test_full_recompute_holds_one_whole_layer_again() -> None:
    facts = MemoryFacts(loss_bytes=LOGIT_BYTES)
    full = _one("llama-3-70b", 8, 8, 4096, "dp=1 tp=8 pp=1 micro_batch=1 zero=0 sp=1 "
                "recompute=full", "bf16", MemoryOptions(False, True, facts=facts))
    none = _one("llama-3-70b", 8, 8, 4096, "dp=1 tp=8 pp=1 micro_batch=1 zero=0 sp=1 "
                "recompute=none", "bf16", MemoryOptions(False, True))
    per_layer_none = (none.activations[0] - full.activations[0]) / 80
    # The working layer is the whole layer's activations less the input full recompute keeps.
    assert full.transient[0] == pytest.approx(per_layer_none, rel=1e-9)


def test_megatron_holds_fp32_gradients_and_torchtitan_fsdp2_keeps_the_root() -> None:
    lay = "dp=8 tp=1 pp=1 micro_batch=1 zero=1 recompute=none"
    plain = _one("llama-3-8b", 8, 8, 4096, lay, "bf16", MemoryOptions(False, True))
    mega = _one("llama-3-8b", 8, 8, 4096, lay, "bf16",
                MemoryOptions(False, True, facts=FRAMEWORKS["megatron"].memory))
    assert mega.gradients[0] == pytest.approx(2 * plain.gradients[0], rel=1e-12)
    model = get_model("llama-3-8b")
    titan = FRAMEWORKS["torchtitan"].memory
    assert titan is not None
    z3 = "dp=8 tp=1 pp=1 micro_batch=1 zero=3 recompute=none"
    no_root = _one("llama-3-8b", 8, 8, 4096, z3, "bf16",
                   MemoryOptions(False, True, facts=replace(titan, fsdp2_root=False)))
    root = _one("llama-3-8b", 8, 8, 4096, z3, "bf16", MemoryOptions(False, True, facts=titan))
    logits, head = 4096 * model.vocab, 2 * model.vocab * model.d_model
    # Without the FSDP2 facts the ZeRO-3 terms (two gathered layers at 2 B, one layer's
    # gradients at 2 + 4 B) add to the loss's working set (12 - 4 B per logit) ...
    layer = layer_params_per_tp_rank(model, 1, False) * (2 * 2 + 2 + 4)
    assert no_root.transient[0] == pytest.approx(8 * logits + layer, rel=1e-12)
    # ... with them the largest moment counts: here the loss's backward, beside the final
    # norm and head FSDP2 keeps gathered (the layers' moment, 2.18 GB less the 2.10 GB of
    # fp32 logits freed by then, and the head's, 1.05 + 3 x 1.05 GB less the same, are
    # smaller).
    assert root.transient[0] == pytest.approx(8 * logits + head, rel=1e-12)


def test_megatron_fp8_saves_linear_inputs_in_fp8_and_torchtitan_keeps_bf16() -> None:
    # Transformer Engine keeps the fp8 copy of each linear input; torchao's Float8Linear the
    # bf16 input (plan/memory_peak.py MemoryFacts.fp8_input_bytes).
    lay = "dp=8 tp=1 pp=1 micro_batch=1 zero=1 recompute=none"
    model = get_model("llama-3-8b")

    def acts(policy: str, fw: str) -> float:
        opt = MemoryOptions(False, True, facts=FRAMEWORKS[fw].memory)
        return float(_one("llama-3-8b", 8, 8, 8192, lay, policy, opt).activations[0])

    assert acts("fp8", "torchtitan") == acts("bf16", "torchtitan") == acts("bf16", "megatron")
    tokens = 8192 * model.layers
    saved = tokens * (2 * model.d_model + model.d_ff - model.q_dim)  # 1 B fewer per element
    assert acts("bf16", "megatron") - acts("fp8", "megatron") == pytest.approx(saved, rel=1e-12)


def test_published_peaks_within_the_documented_error() -> None:
    errs = memory_errors()
    names = [r.name for r in memory_runs()]
    assert len(errs) >= 23
    # Megatron-LM's own 7B runs without recompute: within 3% of their allocated peaks.
    for name, e in zip(names, errs, strict=True):
        if name.startswith("MLM"):
            assert abs(e) < 0.03, name
    assert float(np.mean(np.abs(errs))) < 0.12
    text = DOC.read_text(encoding="utf-8")
    assert memory_table().splitlines()[-1] in text


def test_moe_combine_bytes_follow_the_framework() -> None:
    # Megatron-Core keeps no combined expert outputs, torchtitan an fp32 copy of them.
    lay = "dp=8 tp=1 pp=1 ep=8 micro_batch=1 zero=1 recompute=none"

    def acts(fw: str | None) -> float:
        facts = FRAMEWORKS[fw].memory if fw else None
        mem = _one("qwen3-30b-a3b", 8, 8, 4096, lay, "bf16", MemoryOptions(False, True,
                                                                          facts=facts))
        return float(mem.activations[0])

    model = get_model("qwen3-30b-a3b")
    assert model.moe is not None
    combined = 4096 * model.moe.experts_per_token * model.d_model * model.layers  # S·h
    assert acts(None) - acts("megatron") == pytest.approx(2 * combined, rel=1e-12)
    assert acts("torchtitan") - acts(None) == pytest.approx(2 * combined, rel=1e-12)


def test_torchtitan_loss_parallel_peaks_at_16_bytes_per_local_logit() -> None:
    # loss_parallel's DTensor cross-entropy (tp > 1): 16 B per local logit at its peak, of
    # which the fp32 logits' 4 are already held; without tp the plain loss's 12.
    facts = FRAMEWORKS["torchtitan"].memory
    model = get_model("llama-3-8b")
    got = {}
    for tp in (1, 2):
        lay = f"dp={8 // tp} tp={tp} pp=1 micro_batch=1 zero=0 recompute=none"
        mem = _one("llama-3-8b", 8, 8, 2048, lay, "bf16", MemoryOptions(False, True,
                                                                       facts=facts))
        none = _one("llama-3-8b", 8, 8, 2048, lay, "bf16", MemoryOptions(False, True))
        got[tp] = float(mem.transient[0] - none.transient[0])
    logits = 2048 * model.vocab
    assert got[1] == pytest.approx((12 - 4) * logits, rel=1e-9)
    assert got[2] == pytest.approx((16 - 4) * logits / 2, rel=1e-9)


@pytest.mark.parametrize(("policy", "per_token"), [("bf16", 2 - 2 / 4), ("fp8", 1 - 2 / 4)])
def test_dtensor_sequence_parallel_keeps_its_gathered_inputs(policy: str,
                                                             per_token: float) -> None:
    """torchtitan (DTensor SP) keeps two gathered inputs per layer whole (T·h, in fp8 under
    an fp8 policy) where Megatron keeps the T·h/t shard: saved without recompute, in the
    recompute working set with full recompute (benchmarks/sp_saved_inputs.py)."""
    model = get_model("llama-3-8b")  # 32 layers, h 4096
    extra = 2 * 2 * 4096 * model.d_model * per_token  # micro-batch 2 x seq 4096, tp 4
    lay = rank_layout(4096, get_policy(policy), 2, 4, True, "none", 1, 1, 1)
    assert gathered_input_bytes(model, lay, 2) == pytest.approx(extra, rel=1e-12)
    assert gathered_input_bytes(model, replace(lay, sp=False), 2) == 0.0
    assert gathered_input_bytes(model, lay, 0) == 0.0
    torchtitan = FRAMEWORKS["torchtitan"].memory
    assert torchtitan is not None and torchtitan.sp_gathered_inputs == 2
    # The loss's working set held to the fp32 logits already counted (0 added), so that a
    # layer's working set is the transient peak; the same facts without the gathered inputs.
    torchtitan = replace(torchtitan, loss_bytes=LOGIT_BYTES, parallel_loss_bytes=0.0)
    megatron = replace(torchtitan, sp_gathered_inputs=0)

    def mem(recompute: str, facts: MemoryFacts) -> object:
        return _one("llama-3-8b", 8, 4, 4096, f"dp=2 tp=4 pp=1 sp=1 micro_batch=2 zero=1 "
                    f"recompute={recompute}", policy, MemoryOptions(False, True,
                                                                    facts=facts))

    kept, shard = mem("none", torchtitan), mem("none", megatron)
    assert kept.activations[0] - shard.activations[0] == pytest.approx(
        model.layers * extra, rel=1e-9)
    full, full_shard = mem("full", torchtitan), mem("full", megatron)
    assert full.activations[0] == full_shard.activations[0]
    # One layer runs again at a time: its gathered inputs join the working set.
    assert full.transient[0] - full_shard.transient[0] == pytest.approx(extra, rel=1e-9)


def test_torchtitan_pipeline_accumulates_the_embedding_gradient_whole_on_rank_0() -> None:
    # With pp, FSDP2 keeps every block gathered (2 B) with its fp32 gradient, the root's
    # embedding (its tp shard, 2 B) and the embedding's fp32 gradient accumulated whole:
    # DTensor's embedding backward has no row-wise strategy, so under tp it is the full
    # [vocab, d_model] on every tp rank (train/report_fsdp.whole_embedding_grad_bytes).
    model = get_model("llama-3-8b")
    titan = FRAMEWORKS["torchtitan"].memory
    assert titan is not None
    c = layout_candidates(model, Space(gpus=8, global_batch=16, seq=4096),
                          "dp=2 tp=2 pp=2 micro_batch=1 zero=3 recompute=none sp=1")
    args = dict(dropout=False, flash=True, by_op=False, moe=np.zeros((1, 1)),
                head=np.zeros((1, 1), bool))
    rank0 = transient_bytes(model, c, 4096, get_policy("bf16"), titan, rank=np.zeros((1, 1)),
                            dense=np.full((1, 1), 16.0), **args)
    block = layer_params_per_tp_rank(model, 2, False)
    vh = model.vocab * model.d_model
    assert rank0[0, 0] == pytest.approx(16 * block * (2 + 4) + vh / 2 * 2 + vh * 4, rel=1e-12)
    # A middle rank holds its blocks only.
    middle = transient_bytes(model, c, 4096, get_policy("bf16"), titan, rank=np.ones((1, 1)),
                             dense=np.full((1, 1), 16.0), **args)
    assert middle[0, 0] == pytest.approx(16 * block * (2 + 4), rel=1e-12)
