"""The garden language: fixed vocabulary, seed-determinism, document shape and spread."""

import random
import statistics

import pytest

from shardlab.errors import SpecError
from shardlab.nn.garden import Vocab, garden_documents, garden_vocab


def test_vocab_is_fixed_small_and_starts_with_specials() -> None:
    v = garden_vocab()
    assert v == garden_vocab()
    assert (v.pad, v.bos, v.eos, v.unk) == (0, 1, 2, 3)
    assert v.words[:4] == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert 100 <= v.size <= 200
    assert len(set(v.words)) == v.size


def test_vocab_round_trip_and_unknown_words() -> None:
    v = garden_vocab()
    text = "the red fox chases the hen near the shed. where is the rake? yes, it is sunny."
    ids = v.encode(text)
    assert v.unk not in ids
    assert v.decode(ids) == text
    known = [v.words.index(w) for w in ("the", "fox", "sees", "a")]
    assert v.encode("The Fox sees a ZEBRA.") == [*known, v.unk, v.words.index(".")]
    assert v.decode([v.bos, *v.encode("the cat sleeps."), v.eos, v.pad]) == "the cat sleeps."


def test_vocab_refuses_bad_words_and_ids() -> None:
    with pytest.raises(SpecError):
        Vocab(("a", "b"))
    with pytest.raises(SpecError):
        Vocab(("<pad>", "<bos>", "<eos>", "<unk>", "x", "x"))
    with pytest.raises(SpecError) as e:
        garden_vocab().decode([garden_vocab().size])
    assert e.value.field == "ids"


def test_same_seed_same_documents_and_global_rng_untouched() -> None:
    random.seed(123)
    before = random.random()
    random.seed(123)
    a = garden_documents(50, seed=7)
    assert random.random() == before  # the global RNG was not used
    assert a == garden_documents(50, seed=7)
    assert a != garden_documents(50, seed=8)
    assert garden_documents(20, seed=7) == a[:20]


def test_documents_are_wrapped_known_and_spread_in_length() -> None:
    v = garden_vocab()
    docs = garden_documents(300, seed=0)
    lengths = [len(d) for d in docs]
    for d in docs:
        assert d[0] == v.bos and d[-1] == v.eos
        assert all(3 < t < v.size for t in d[1:-1])  # no special or unknown inside
        assert v.encode(v.decode(d)) == d[1:-1]
    assert min(lengths) >= 5 and max(lengths) <= 60
    assert min(lengths) <= 12 and max(lengths) >= 50
    assert statistics.pstdev(lengths) > 10


def test_bad_document_count() -> None:
    assert garden_documents(0) == []
    for bad in (-1, 2.0, True):
        with pytest.raises(SpecError) as e:
            garden_documents(bad)  # type: ignore[arg-type]
        assert e.value.field == "n_docs"
    with pytest.raises(SpecError):
        garden_documents(1, seed="x")  # type: ignore[arg-type]
