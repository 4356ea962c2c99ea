"""Tensor-parallel bytes of torch's DTensor plan, against collectives counted by hand.

Each case is the count one can read off ``shardlab.distributed.tensor_parallel.tp_plan``
(and that ``shardlab train`` measures: tests/cli/test_train_cli.py): A = b·s·d·4 bytes of
one fp32 activation; with t = 2 a ring all-reduce sends A, an all-gather or reduce-scatter
A/2.
"""

from __future__ import annotations

import pytest

from shardlab.config.layout import make_layout
from shardlab.config.model import ModelShape
from shardlab.estimate.comm_dtensor import column_linears, tp_bytes_dtensor
from shardlab.estimate.params import norm_params

B, S, D, V, L = 8, 32, 32, 156, 2
A = B * S * D * 4


def shape(style: str) -> ModelShape:
    return ModelShape(name="tiny", style=style, layers=L, d_model=D, heads=4, kv_heads=4,
                      d_ff=4 * D, vocab=V, context=S, tied=style == "gpt")


def layout(m: ModelShape, **kw: object) -> object:
    args = {"dp": 1, "tp": 2, "pp": 1, "micro_batch": B, "global_batch": B, "seq": S,
            "dtype": "fp32"} | kw
    return make_layout(m, **args)


def test_column_linears() -> None:
    assert column_linears(shape("gpt")) == 4  # q, k, v, fc
    assert column_linears(shape("llama")) == 5  # q, k, v, gate, up


def test_gpt_without_sp_one_backward_all_reduce_per_module_input() -> None:
    m = shape("gpt")
    # per layer: 2 forward (o, fc2 outputs) + 2 backward (the attention's input, read by q,
    # k and v, and the MLP's, read by fc: Megatron's f); tied head replicated: nothing
    # around the blocks.
    assert tp_bytes_dtensor(m, layout(m)) == [L * 4 * A]


def test_llama_vocab_parallel_ends_and_the_logits_gather() -> None:
    m = shape("llama")
    logits_gather = B * S * V * 4 / 2  # (t-1)/t of the whole fp32 logits
    assert tp_bytes_dtensor(m, layout(m)) == [L * 4 * A + 2 * A + logits_gather]
    # loss_parallel: no gather, three b·s fp32 all-reduces in the cross-entropy instead
    assert tp_bytes_dtensor(m, layout(m), loss_parallel=True) == [
        L * 4 * A + 2 * A + 3 * B * S * 4]


def test_full_recompute_reruns_one_all_reduce_per_block() -> None:
    m = shape("gpt")  # non-reentrant checkpoint stops before the MLP's output all-reduce
    assert tp_bytes_dtensor(m, layout(m, recompute="full")) == [L * 5 * A]


def test_per_operator_checkpointing_reruns_the_forward_gathers_only() -> None:
    m = shape("gpt")
    # Without sp: the attention output's all-reduce again, as under full recompute.
    lay = layout(m, recompute="selective")
    assert tp_bytes_dtensor(m, lay, op_recompute=True) == [L * 5 * A]
    # With sp: the two all-gathers again (full recompute also runs a reduce-scatter again,
    # whose output per-operator checkpointing keeps).
    sp = layout(m, sp=True, recompute="selective")
    plain = tp_bytes_dtensor(m, sp)[0]
    assert tp_bytes_dtensor(m, sp, op_recompute=True) == [plain + L * 2 * A / 2]
    assert tp_bytes_dtensor(m, layout(m, sp=True, recompute="full")) == [plain + L * 3 * A / 2]


@pytest.mark.parametrize("fsdp", [False, True])
def test_sequence_parallel(fsdp: bool) -> None:
    m = shape("gpt")
    lay = layout(m, sp=True, micro_batch=B // 2)
    a = A / 2  # two micro-batches of b/2
    # per layer and micro-batch 4 all-gathers + 4 reduce-scatters of a, each a/2 sent; the
    # scatter at the first block gathers its gradient, the head's input is gathered; the
    # norms' gradients (4 vectors of d per layer) are all-reduced per micro-batch, or
    # once under FSDP.
    norms = L * 4 * D * 4 * (1 if fsdp else 2)
    assert tp_bytes_dtensor(m, lay, fsdp=fsdp) == [2 * (L * 8 * a / 2 + 2 * a / 2) + norms]


def test_fsdp_in_a_pipeline_reduces_the_norm_gradients_in_fp32() -> None:
    """amp-bf16 (train's bf16: fp32 gradients, bf16 activations), t = 2 (an all-reduce of
    n bytes sends n): without FSDP the sequence-parallel norms' gradients are all-reduced
    every micro-batch in fp32; FSDP reduces them once per step, in bf16 (the gathered
    parameters' dtype), but in a pipeline it has accumulated them unsharded in its fp32
    reduce dtype over the micro-batches, so 4 bytes an element there."""
    m = shape("gpt")
    n = norm_params(m)  # one LayerNorm's weight and bias
    one = layout(m, sp=True, dtype="amp-bf16", micro_batch=B // 2)
    plain, fsdp = tp_bytes_dtensor(m, one)[0], tp_bytes_dtensor(m, one, fsdp=True)[0]
    assert plain - fsdp == 2 * (2 * L * n * 4) - 2 * L * n * 2
    two = layout(m, sp=True, dtype="amp-bf16", pp=2, micro_batch=B // 2)
    plain, fsdp = tp_bytes_dtensor(m, two)[0], tp_bytes_dtensor(m, two, fsdp=True)[0]
    assert plain - fsdp == 2 * (2 * n * 4) - 2 * n * 4  # the stage's one block


def test_autocast_moves_the_norms_outputs_and_their_gradients_in_fp32() -> None:
    """bf16 under autocast (no FSDP): the norms' outputs, the embedding's and the residual
    stream are fp32 (fp32 parameters), the matmuls' outputs bf16. With sequence
    parallelism per block the norms' outputs gathered (2) and their gradients
    reduce-scattered (2) move 4 bytes, the row outputs (2) and their gradients (2) 2; the
    embedding's reduce-scatter and its gradient's gather and the head input's gather and
    its gradient's reduce-scatter move 4; the logits 2. Without it the row outputs'
    all-reduces move 2 bytes, the 2 module inputs' gradients 4, the ends 4."""
    m = shape("llama")
    lay = layout(m, sp=True, dtype="amp-bf16")  # train's bf16: fp32 gradients
    e = B * S * D  # elements of one activation; with t = 2 a gather sends half
    logits = B * S * V * 2 / 2
    norms = (2 * L + 1) * D * 4  # every norm's fp32 gradient all-reduced (no FSDP)
    assert tp_bytes_dtensor(m, lay, autocast=True)[0] == pytest.approx(
        L * (4 * e * 4 / 2 + 4 * e * 2 / 2) + 4 * e * 4 / 2 + logits + norms)
    lay = layout(m, dtype="amp-bf16")
    assert tp_bytes_dtensor(m, lay, autocast=True)[0] == pytest.approx(
        L * (2 * e * 2 + 2 * e * 4) + 2 * e * 4 + logits)


def test_pipeline_stages_split_the_ends() -> None:
    m = shape("llama")
    lay = layout(m, pp=2, micro_batch=B // 2)
    first, last = tp_bytes_dtensor(m, lay)
    a = A / 2
    assert first == 2 * (4 * a + a)
    assert last == 2 * (4 * a + a + B // 2 * S * V * 4 / 2)


def test_no_tensor_parallelism_sends_nothing() -> None:
    m = shape("llama")
    assert tp_bytes_dtensor(m, layout(m, tp=1)) == [0.0]


@pytest.mark.parametrize("sp", [False, True])
def test_uneven_stages_move_a_layer_s_bytes(sp: bool) -> None:
    """stage_layers 3+1 against the even 2+2 of a 4-layer model: rank 0 sends one layer's
    bytes more and rank 1 one layer's less (the ends stay where they were); the real run
    of `--tp 2 --pp 2 --stage-layers 3,1` counted these bytes exactly."""
    m = ModelShape(name="tiny", style="llama", layers=4, d_model=D, heads=4, kv_heads=4,
                   d_ff=4 * D, vocab=V, context=S, tied=False)
    even = tp_bytes_dtensor(m, layout(m, pp=2, micro_batch=B // 2, sp=sp))
    uneven = tp_bytes_dtensor(m, layout(m, pp=2, micro_batch=B // 2, sp=sp,
                                        stage_layers=(3, 1)))
    one_layer = uneven[0] - even[0]
    assert one_layer > 0 and even[1] - uneven[1] == one_layer


def test_a_v_schedule_puts_the_head_on_rank_0() -> None:
    """zb-v places the last chunk (with the head and the logits' gather) on rank 0, with
    the first (the embedding's all-reduce)."""
    m = ModelShape(name="tiny", style="llama", layers=4, d_model=D, heads=4, kv_heads=4,
                   d_ff=4 * D, vocab=V, context=S, tied=False)
    first, last = tp_bytes_dtensor(m, layout(m, pp=2, micro_batch=B // 4, virtual_stages=2,
                                             schedule="zb-v"))
    # 4 micro-batches of 2: the logits' all-gather (half of them sent) and both ends'
    # all-reduces of the activations (2 (t-1)/t of them) are rank 0's; the layers even.
    gather = 4 * (B // 4 * S * V * 4) / 2
    ends = 4 * 2 * (B // 4 * S * D * 4)
    assert first - last == gather + ends


def test_fp8_linears_gather_at_one_byte_and_reduce_their_scales() -> None:
    """``train --dtype fp8`` under sequence parallelism, llama, t = 2, all seven linears in
    fp8 (bf16 activations, G = A/4 bytes sent per bf16 gather): per block and
    micro-batch the attention and MLP input gathers and the backward gathers at o and down
    move 1 byte an element (4 x G/2 saved), and 25 float64 scales are all-reduced (8 bytes
    sent each): 7 weights twice, 7 output gradients, the inputs of o and down, and the two
    prepared inputs. A recomputed forward adds 2 more gathers (G/2 saved each) and 11
    scales (7 weights, 4 inputs)."""
    m = shape("llama")
    names = frozenset({"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
    g = A / 2 / 2  # a bf16 activation's ring gather on 2 ranks
    for recompute, extra in (("none", 25 * 8 - 4 * g / 2),
                             ("full", 36 * 8 - 6 * g / 2)):
        lay = layout(m, sp=True, recompute=recompute, dtype="bf16")
        bf16 = tp_bytes_dtensor(m, lay)[0]
        fp8 = tp_bytes_dtensor(m, lay, fp8=names)[0]
        assert fp8 - bf16 == pytest.approx(L * extra)
    # Without sequence parallelism nothing is gathered: only scales (7 x 2 weights, the 5
    # column-parallel outputs' gradients, the inputs of o and down).
    lay = layout(m, recompute="none", dtype="bf16")
    diff = tp_bytes_dtensor(m, lay, fp8=names)[0] - tp_bytes_dtensor(m, lay)[0]
    assert diff == pytest.approx(L * 21 * 8)


def test_fp8_weights_gathered_by_fsdp_take_their_scales_once_a_step() -> None:
    """``--fp8-all-gather``: a weight's scale comes from the amaxes reduced after the step
    (one fp32 all-reduce of the rank's fp8 weights' amaxes over tp: 7 x L x 4 bytes), so
    its casts reduce none: 14 fewer float64 scales a block and micro-batch."""
    m = shape("llama")
    names = frozenset({"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
    lay = layout(m, dtype="bf16")
    plain = tp_bytes_dtensor(m, lay, fp8=names)[0]
    gathered = tp_bytes_dtensor(m, lay, fp8=names, fp8_gather=True)[0]
    assert plain - gathered == pytest.approx(L * 14 * 8 - 7 * L * 4)


def test_an_input_read_by_a_bf16_linear_is_gathered_in_bf16() -> None:
    """k and v left in bf16 (a width fp8's matmul cannot take): the attention's input is
    gathered in bf16 and q casts its own replicated copy (no scale to reduce); the MLP's
    input still moves at 1 byte."""
    m = shape("llama")
    fp8 = frozenset({"attn.q_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                     "mlp.down_proj"})
    lay = layout(m, sp=True, dtype="bf16")
    g = A / 2 / 2
    scales = 2 * 5 + 5 + 2 + 1  # weights twice, output gradients, o's and down's inputs, mlp
    diff = tp_bytes_dtensor(m, lay, fp8=fp8)[0] - tp_bytes_dtensor(m, lay)[0]
    assert diff == pytest.approx(L * (scales * 8 - 3 * g / 2))
