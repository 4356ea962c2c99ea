"""Corpora loaders, causal-LM batches and their masks, and why the loss is token-weighted."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.nn.data import (
    BYTE_VOCAB,
    MAX_BIN_VOCAB,
    Batch,
    batches,
    bin_documents,
    bin_vocab,
    byte_documents,
    decode_bytes,
    global_token_normalizer,
    make_batch,
)
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import TransformerLM

# --- make_batch ---------------------------------------------------------------------------

HAND = [[1, 5, 6, 2], [1, 7, 2], [1, 8, 9, 10, 11, 2]]  # lengths 4, 3, 6; seq 4 cuts the last


def test_make_batch_shifts_pads_and_masks_a_hand_made_example() -> None:
    b = make_batch(HAND, seq=4)
    assert (b.size, b.seq) == (3, 4)
    assert b.input_ids.tolist() == [[1, 5, 6, 2], [1, 7, 2, 0], [1, 8, 9, 10]]
    assert b.targets.tolist() == [[5, 6, 2, 0], [7, 2, 0, 0], [8, 9, 10, 11]]
    assert b.loss_mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert b.pad_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert all(t.dtype == torch.int64 for t in (b.input_ids, b.targets, b.loss_mask,
                                                b.pad_mask))
    assert b.real_tokens == 9 == global_token_normalizer(b)


def test_masks_come_from_lengths_not_from_the_pad_id() -> None:
    b = make_batch([[1, 0, 0, 2], [1, 2]], seq=4, pad=99)  # id 0 is a real token here
    assert b.input_ids.tolist() == [[1, 0, 0, 2], [1, 2, 99, 99]]
    assert b.targets.tolist() == [[0, 0, 2, 99], [2, 99, 99, 99]]
    assert b.loss_mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert b.pad_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_split_and_chunk() -> None:
    b = make_batch(garden_documents(12, seed=1), seq=16)
    halves = b.split(2)
    assert [h.size for h in halves] == [6, 6]
    assert [q.size for q in b.split(4)] == [3, 3, 3, 3]
    assert sum(h.real_tokens for h in halves) == b.real_tokens
    assert torch.equal(torch.cat([h.input_ids for h in halves]), b.input_ids)
    assert torch.equal(b.chunk(1, 3).targets, b.targets[4:8])
    assert b.split(1)[0].input_ids.shape == b.input_ids.shape


@pytest.mark.parametrize(("call", "field"), [
    (lambda b: b.split(5), "n"), (lambda b: b.split(0), "n"),
    (lambda b: b.chunk(4, 4), "i"), (lambda b: b.chunk(-1, 2), "i"),
])
def test_split_errors(call, field: str) -> None:
    with pytest.raises(SpecError) as e:
        call(make_batch([*HAND, [1, 2]], seq=4))
    assert e.value.field == field


def test_make_batch_errors() -> None:
    for docs, seq, field in (([], 4, "docs"), ([[1, 2], []], 4, "docs"), (HAND, 0, "seq")):
        with pytest.raises(SpecError) as e:
            make_batch(docs, seq)
        assert e.value.field == field
    with pytest.raises(SpecError):
        Batch(*(torch.zeros(2, 3, dtype=torch.int64),) * 3, torch.zeros(2, 4))
    with pytest.raises(SpecError) as e:
        global_token_normalizer(make_batch([[1], [2]], seq=3))  # no targets at all
    assert e.value.field == "batch"


# --- batches ------------------------------------------------------------------------------

def test_batches_are_deterministic_epochs_shuffled_and_cover_every_doc() -> None:
    docs = [[1, 10 + k, 2] for k in range(10)]

    def firsts(seed: int, n: int) -> list[list[int]]:
        stream = batches(docs, batch_size=3, seq=4, seed=seed)
        return [next(stream).input_ids[:, 1].tolist() for _ in range(n)]

    run = firsts(0, 6)  # 3 batches per epoch (the 10th document waits for a later epoch)
    assert run == firsts(0, 6)
    assert run != firsts(1, 6)
    epoch0 = sorted(k for b in run[:3] for k in b)
    assert len(set(epoch0)) == 9 and set(epoch0) <= set(range(10, 20))
    assert run[:3] != run[3:]  # the next epoch is a different shuffle
    with pytest.raises(SpecError) as e:
        next(batches(docs, batch_size=11, seq=4))
    assert e.value.field == "batch_size"


# --- loaders ------------------------------------------------------------------------------

def test_byte_documents_round_trip(tmp_path: Path) -> None:
    data = b"hello garden\n\nsecond part\n \n\nthird " + bytes(range(256)) * 2
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    vocab, docs = byte_documents(path, doc_tokens=16)
    assert vocab == BYTE_VOCAB == 259
    assert all(d[0] == 1 and d[-1] == 2 and 3 <= len(d) <= 18 for d in docs)
    assert all(3 <= t <= 258 for d in docs for t in d[1:-1])
    assert decode_bytes(docs[0]) == b"hello garden\n\n"  # a blank line ends a document
    assert decode_bytes(docs[1]) == b"second part\n \n\n"
    assert b"".join(decode_bytes(d) for d in docs) == data


def test_byte_documents_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    for path in (tmp_path / "missing.txt", empty, tmp_path):
        with pytest.raises(SpecError) as e:
            byte_documents(path)
        assert (e.value.field, e.value.value) == ("data", str(path))
    with pytest.raises(SpecError) as e:
        byte_documents(empty, doc_tokens=0)
    assert e.value.field == "doc_tokens"


@pytest.mark.parametrize(("dtype", "np_dtype", "eos"), [
    ("uint16", np.uint16, 50256), ("uint32", np.uint32, 100_000),
])
def test_bin_documents(tmp_path: Path, dtype: str, np_dtype: type, eos: int) -> None:
    tokens = [5, 6, eos, 7, eos, 8, 9, 10, 11, 12]
    path = tmp_path / f"train.{dtype}.bin"
    np.array(tokens, dtype=np_dtype).tofile(path)
    by_eos = bin_documents(path, dtype=dtype, doc_tokens=3, eos=eos)
    assert by_eos == [[5, 6, eos], [7, eos], [8, 9, 10], [11, 12]]
    assert bin_documents(path, dtype=dtype, doc_tokens=4) == [tokens[:4], tokens[4:8],
                                                               tokens[8:]]
    assert all(type(t) is int for d in by_eos for t in d)


def test_bin_documents_errors(tmp_path: Path) -> None:
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    cases = [((tmp_path / "missing.bin",), {}, "data"), ((odd,), {}, "data"),
             ((odd,), {"dtype": "uint32"}, "data"), ((empty,), {}, "data"),
             ((odd,), {"dtype": "int64"}, "dtype"), ((odd,), {"doc_tokens": 0}, "doc_tokens"),
             ((odd,), {"eos": -1}, "eos")]
    for args, kw, field in cases:
        with pytest.raises(SpecError) as e:
            bin_documents(*args, **kw)
        assert e.value.field == field



def test_bin_vocab_is_the_largest_id_plus_one_within_a_sane_bound(tmp_path: Path) -> None:
    path = tmp_path / "ids.bin"
    np.array([3, MAX_BIN_VOCAB - 1, 7], dtype=np.uint32).tofile(path)
    assert bin_vocab(bin_documents(path, "uint32", doc_tokens=2), path, "uint32") == (
        MAX_BIN_VOCAB)
    # A uint16 file read as uint32 pairs its ids into numbers near 2**32.
    np.array([5, 50256, 7, 8], dtype=np.uint16).tofile(path)
    docs = bin_documents(path, "uint32", doc_tokens=2)
    largest = max(max(d) for d in docs)
    assert largest == 50256 * 65536 + 5
    with pytest.raises(SpecError) as e:
        bin_vocab(docs, path, "uint32")
    assert e.value.field == "data" and f"{largest:,}" in e.value.allowed
    assert "--bin-dtype" in e.value.allowed


# --- token weighting ----------------------------------------------------------------------

def _grads(model: TransformerLM, b: Batch, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed loss of ``b`` / scale, its gradient over all parameters, flattened)."""
    loss = lm_loss_sum(model(b.input_ids, b.pad_mask), b.targets, b.loss_mask) / scale
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return loss.detach(), torch.cat([g.flatten() for g in grads])


def test_global_token_weighting_equals_one_device_and_mean_of_means_does_not() -> None:
    vocab = garden_vocab()
    shape = ModelShape("t", layers=1, d_model=32, heads=2, vocab=vocab.size, context=64,
                       style="llama", tied=False)
    model = TransformerLM(shape, dtype=torch.float64)
    docs = sorted(garden_documents(60, seed=3), key=len)
    batch = make_batch([docs[0], docs[1], docs[-2], docs[-1]], seq=63)  # 2 short, 2 long
    short, long_ = batch.split(2)
    assert long_.real_tokens > 3 * short.real_tokens

    n = global_token_normalizer(batch)
    whole_loss, whole_grad = _grads(model, batch, n)
    parts = [_grads(model, share, n) for share in (short, long_)]  # each rank: sum / global n
    assert_close(sum(p[0] for p in parts), whole_loss, rtol=1e-12, atol=1e-12)
    assert_close(sum(p[1] for p in parts), whole_grad, rtol=1e-12, atol=1e-12)

    means = [_grads(model, share, share.real_tokens) for share in (short, long_)]
    mean_of_means = (means[0][0] + means[1][0]) / 2
    assert abs(mean_of_means - whole_loss) / whole_loss > 1e-4
    assert not torch.allclose((means[0][1] + means[1][1]) / 2, whole_grad, rtol=1e-4)
