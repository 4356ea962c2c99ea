"""The chunk-cached encoder gives exactly ``tokenizers``' ids, and is used only where that
holds (:mod:`shardlab.data.encode`, :func:`shardlab.data.tokenizer.cache_refusal`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers")

from shardlab.data.encode import Encoder
from shardlab.data.tokenizer import TokenizerFile, load_tokenizer
from shardlab.errors import SpecError

# Characters where the pre-tokenizers' regexes differ most: spaces before whitespace,
# Unicode spaces and marks, digits, contractions, control characters, the batch's own
# mark (\x01), special tokens inside the text.
PIECES = [*"ab XYZ  \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u2003\u3000'sd123!?.,-_é∑中\u0301\x01\x00",
          "\U0001f600", "<|endoftext|>", "<s>", "'s", " 's", "  ", "\n\n", " the cat", "ll"]
DOCS = st.lists(st.lists(st.sampled_from(PIECES), min_size=1, max_size=40).map("".join),
                min_size=1, max_size=8)


def split(tokens: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    return [p.tolist() for p in np.split(tokens, np.cumsum(lengths)[:-1])]


def want(tf: TokenizerFile, docs: list[str]) -> list[list[int]]:
    eos = [] if tf.eos_id is None else [tf.eos_id]
    return [e.ids + eos for e in tf.build().encode_batch(docs, add_special_tokens=True)]


@pytest.mark.parametrize(("kind", "bos"), [("gpt2", False), ("llama3", True), ("qwen2", False)])
def test_the_cache_equals_tokenizers(make_tokenizer: Callable[..., Path], kind: str,
                                     bos: bool) -> None:
    tf = load_tokenizer(make_tokenizer(kind, bos), eos="<|endoftext|>")
    assert tf.cached == "" and tf.prefix == ((1,) if bos else ())
    encoder = Encoder(tf)  # one encoder throughout: later examples hit its cache

    @settings(max_examples=50, database=None)
    @given(DOCS)
    def case(docs: list[str]) -> None:
        tokens, lengths = encoder.encode(docs)
        assert tokens.dtype == np.uint32 and lengths.dtype == np.int64
        assert split(tokens, lengths) == want(tf, docs)
        assert encoder.cached, encoder.note  # never turned off by the first batch's check

    case()


def test_refused_tokenizers_run_as_tokenizers_does(make_tokenizer: Callable[..., Path],
                                                   tmp_path: Path) -> None:
    doc = json.loads(make_tokenizer("gpt2").read_text())
    edits = {
        "normalizer": ({"type": "NFC"}, "it has a normalizer"),
        "pre_tokenizer": ({"type": "Whitespace"}, "its pre-tokenizer is not"),
        "added_tokens": ([*doc["added_tokens"], {**doc["added_tokens"][0], "id": 300,
                                                  "content": "a b"}], "holds or strips"),
    }
    for key, (value, reason) in edits.items():
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**doc, key: value}))
        tf = load_tokenizer(path)
        assert reason in tf.cached
        encoder = Encoder(tf)
        docs = ["the  cat sat.\n\n", "a b c", "naïve"]
        assert not encoder.cached and split(*encoder.encode(docs)) == want(tf, docs)


def test_a_wrong_cache_is_caught_on_the_first_batch(make_tokenizer: Callable[..., Path]
                                                    ) -> None:
    tf = load_tokenizer(make_tokenizer("gpt2"))
    encoder = Encoder(tf)
    encoder._spaced["cat"] = np.asarray([7], "<u4").tobytes()  # a wrong cached chunk
    docs = ["the cat", "a cat sat"]
    assert split(*encoder.encode(docs)) == want(tf, docs)
    assert not encoder.cached and "differed" in encoder.note


def test_a_full_cache_starts_over(make_tokenizer: Callable[..., Path],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from shardlab.data import encode

    monkeypatch.setattr(encode, "CACHE_ENTRIES", 4)
    tf = load_tokenizer(make_tokenizer("gpt2"))
    encoder = Encoder(tf)
    for docs in (["the cat sat on the mat"], ["a dog ran to the big red barn", "the cat"]):
        assert split(*encoder.encode(docs)) == want(tf, docs)
    assert encoder.cached and len(encoder._spaced) <= 12


def test_no_documents_and_the_mark_inside_one(make_tokenizer: Callable[..., Path]) -> None:
    tf = load_tokenizer(make_tokenizer("gpt2"))
    encoder = Encoder(tf)
    assert [a.size for a in encoder.encode([])] == [0, 0]
    docs = ["a \x01b", "c"]
    assert split(*encoder.encode(docs)) == want(tf, docs) and encoder.cached


@pytest.mark.parametrize(("content", "eos", "words"), [
    (b"", None, "is empty"),
    (b"\xff\xfe", None, "not UTF-8"),
    (b"{nope", None, "is not JSON"),
    (b'{"model_type": "llama"}', None, "no `model` object"),
    (b'{"model": {"type": "Nope"}}', None, "`tokenizers` can load"),
    (None, "<eos>", "eos='<eos>': is not a token"),
])
def test_bad_tokenizers_are_one_line(make_tokenizer: Callable[..., Path], tmp_path: Path,
                                     content: bytes | None, eos: str | None,
                                     words: str) -> None:
    path = make_tokenizer("gpt2")
    if content is not None:
        path = tmp_path / "tokenizer.json"
        path.write_bytes(content)
    with pytest.raises(SpecError, match=r"^(tokenizer|eos)=") as e:
        load_tokenizer(path, eos)
    assert words in str(e.value) and "\n" not in str(e.value)
    for special in (tmp_path, Path("/dev/zero")):
        with pytest.raises(SpecError, match="folder or a special file"):
            load_tokenizer(special)
