"""``shardlab data prepare`` and ``shardlab train --data DIR``: shards equal to tokenizers'
own ids, bitwise the same with 1 or 2 worker processes, the manifest checked before any
rank starts, bad input one line with nothing written (no real training: the 2-step run
below is the one-process reference, in this process)."""

from __future__ import annotations

import contextlib
import io
import json
import queue
import shutil
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardlab.cli import build_parser, main
from shardlab.nn.garden import garden_documents, garden_vocab

pytest.importorskip("tokenizers")

EOS = "<|endoftext|>"


def prepare(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["data", "prepare", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A text file of 200 garden paragraphs and a JSONL file of 100 (one text empty)."""
    root = tmp_path_factory.mktemp("inputs")
    vocab = garden_vocab()
    texts = [vocab.decode(d) for d in garden_documents(300, 3)]
    (root / "a.txt").write_text("\n\n".join(texts[:200]) + "\n")
    lines = [json.dumps({"text": t}) for t in texts[200:]] + [json.dumps({"text": ""})]
    (root / "b.jsonl").write_text("\n".join(lines) + "\n")
    return [root / "a.txt", root / "b.jsonl"]


@pytest.fixture(scope="module")
def prepared(inputs: list[Path], make_tokenizer: Callable[..., Path],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same inputs prepared with 2 worker processes (--json) and with 1 (in this
    process), and once more without --eos; their folders and outputs."""
    root = tmp_path_factory.mktemp("prepared")
    tok = str(make_tokenizer("gpt2"))
    runs: dict[str, Any] = {"tokenizer": tok}
    for name, extra in (("two", ["--eos", EOS, "--workers", "2", "--json"]),
                        ("one", ["--eos", EOS, "--workers", "1"]),
                        ("plain", ["--workers", "1", "--json"])):
        out, err = io.StringIO(), io.StringIO()  # (capsys is for one test, not a module)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["data", "prepare", *map(str, inputs), "--tokenizer", tok,
                         "--out", str(root / name), *extra])
        runs[name] = {"dir": root / name, "code": code, "out": out.getvalue(),
                      "err": err.getvalue()}
    return runs


def test_shards_are_tokenizers_ids_and_the_same_with_any_workers(
        prepared: dict[str, Any], inputs: list[Path]) -> None:
    from tokenizers import Tokenizer

    two, one = prepared["two"], prepared["one"]
    assert two["code"] == one["code"] == 0
    doc = json.loads(two["out"])  # one JSON document on stdout
    assert doc["workers"] == 2 and doc["dtype"] == "uint16"
    assert doc["tokenizer"]["vocab_size"] == 300 and doc["tokenizer"]["eos_id"] == 0
    assert doc["documents"] == 300 and [s["empty_skipped"] for s in doc["shards"]] == [0, 1]
    assert all(s["encoder"] == "cached" for s in doc["shards"])
    lines = two["err"].splitlines()  # not a terminal: one line per file, no bar
    assert len(lines) == 2 and all("documents" in line and "tokens/s" in line
                                   for line in lines)
    for shard in ("shard-00000.bin", "shard-00000.idx", "shard-00001.bin", "shard-00001.idx",
                  "tokenizer.json"):
        assert (two["dir"] / shard).read_bytes() == (one["dir"] / shard).read_bytes()
    assert (two["dir"] / "tokenizer.json").read_bytes() == \
        Path(prepared["tokenizer"]).read_bytes()
    tok = Tokenizer.from_file(prepared["tokenizer"])
    texts = (inputs[0].read_text().split("\n\n"), [
        json.loads(line)["text"] for line in inputs[1].read_text().splitlines()][:-1])
    for shard, docs in zip(doc["shards"], texts, strict=True):
        if shard["file"] == "shard-00000.bin":  # paragraphs keep their blank lines
            docs = [d + "\n\n" for d in docs[:-1]] + [docs[-1]]
        ids = np.fromfile(two["dir"] / shard["file"], "<u2")
        bounds = np.fromfile(two["dir"] / shard["index"], "<u8")
        assert [ids[a:b].tolist() for a, b in pairwise(bounds)] \
            == [[*e.ids, 0] for e in tok.encode_batch(docs)]
    assert "prepared" in one["out"] and "chunk cache" in one["out"]  # the human view


def test_train_reads_the_folder_before_any_rank(prepared: dict[str, Any],
                                                tmp_path: Path) -> None:
    from shardlab.cli.train import check
    from shardlab.data.manifest import read_prepared
    from shardlab.train.reference import reference_run

    def config(folder: Path) -> Any:
        args = build_parser().parse_args(["train", "--data", str(folder), "--steps", "2",
                                          "--layers", "1", "--d-model", "32",
                                          "--checkpoint-dir", str(tmp_path / "ckpt")])
        return check(args)[0]

    cfg = config(prepared["two"]["dir"])
    assert cfg.shape.vocab == 300
    assert list(cfg.docs) == list(read_prepared(prepared["two"]["dir"], 33)[1])
    assert max(map(len, cfg.docs)) == 33  # chopped to seq + 1, as a .bin is
    # the fingerprint a checkpoint records identifies the prepared tokens
    assert config(prepared["one"]["dir"]).data_id == cfg.data_id
    assert config(prepared["plain"]["dir"]).data_id != cfg.data_id
    losses = reference_run(cfg)  # the run's model and batches, 2 steps on one process
    assert len(losses) == 2 and all(np.isfinite(losses)) and losses[0] < np.log(300) + 1


def _edit(folder: Path, how: str) -> None:
    from shardlab.data.manifest import MANIFEST, digest, sha256_file

    path = folder / MANIFEST
    doc = json.loads(path.read_text())
    shard = folder / "shard-00000.bin"
    if how == "no manifest":
        path.unlink()
    elif how == "truncated":
        shard.write_bytes(shard.read_bytes()[:-2])
    elif how == "flipped":
        data = bytearray(shard.read_bytes())
        data[10] ^= 1
        shard.write_bytes(bytes(data))
    elif how == "edited":
        doc["tokenizer"]["vocab_size"] = 200
        path.write_text(json.dumps(doc))
    elif how in ("dtype", "big id"):
        if how == "dtype":
            doc["dtype"] = "uint8"
        else:  # a consistent folder whose ids exceed its vocabulary
            ids = np.fromfile(shard, "<u2")
            ids[5] = 299
            ids.tofile(shard)
            doc["shards"][0]["file_sha256"] = sha256_file(shard)
            doc["tokenizer"]["vocab_size"] = 299
        path.write_text(json.dumps({**doc, "manifest_sha256": digest(doc)}))
    elif how == "tokenizer":
        (folder / "tokenizer.json").write_text("{}")
    elif how == "not json":
        path.write_text("{")


@pytest.mark.parametrize(("how", "words"), [
    ("no manifest", "is a folder without manifest.json"),
    ("not json", "is not JSON"),
    ("truncated", "manifest.shards[0].file='shard-00000.bin': is "),
    ("flipped", "manifest.shards[0].file_sha256="),
    ("edited", "manifest.manifest_sha256="),
    ("dtype", "manifest.dtype='uint8': must be one of uint16, uint32"),
    ("tokenizer", "manifest.tokenizer.sha256="),
    ("big id", "holds id 299, not below the vocabulary's 299"),
    ("vocab", "vocab=100: must be >= the corpus's 300"),
])
def test_a_bad_folder_is_refused_before_any_rank(
        prepared: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        how: str, words: str) -> None:
    folder = tmp_path / "data"
    shutil.copytree(prepared["one"]["dir"], folder)
    _edit(folder, how)
    start = time.monotonic()
    code = main(["train", "--data", str(folder), *(["--vocab", "100"] if how == "vocab"
                                                    else [])])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert words in err, err
    assert time.monotonic() - start < 3


@pytest.mark.parametrize("case", ["not a tokenizer", "missing input", "folder input",
                                  "empty input", "uint16 too small", "unknown eos",
                                  "out not empty", "bad line midway"])
def test_bad_input_is_one_line_and_writes_nothing(
        case: str, inputs: list[Path], make_tokenizer: Callable[..., Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    tok, files = str(make_tokenizer("gpt2")), [str(p) for p in inputs]
    out, extra = tmp_path / "out", []
    if case == "not a tokenizer":
        tok = files[0]
    elif case == "missing input":
        files.append(str(tmp_path / "nope.txt"))
    elif case == "folder input":
        files.append(str(tmp_path))
    elif case == "empty input":
        (tmp_path / "empty.txt").touch()
        files.append(str(tmp_path / "empty.txt"))
    elif case == "uint16 too small":
        doc = json.loads(Path(tok).read_text())  # 70,000 ids: more than uint16 holds
        doc["model"]["vocab"].update({f"<x{i}>": i for i in range(300, 70_000)})
        Path(tok := str(tmp_path / "big.json")).write_text(json.dumps(doc))
        extra = ["--dtype", "uint16"]
    elif case == "unknown eos":
        extra = ["--eos", "</s>"]
    elif case == "out not empty":
        out.mkdir()
        (out / "keep").write_text("mine")
    elif case == "bad line midway":
        (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"txt": "no"}\n')
        files.append(str(tmp_path / "bad.jsonl"))
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, err = prepare(capsys, *files, "--tokenizer", tok, "--out", str(out),
                                "--workers", "1", *extra)
    errors = [line for line in err.splitlines() if "error" in line]
    assert code == 2 and stdout == "" and len(errors) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no hidden temporary
    expected = {"not a tokenizer": "tokenizer=", "missing input": "input=",
                "folder input": "input=", "empty input": "is empty",
                "uint16 too small": "dtype='uint16': holds 65,536 ids",
                "unknown eos": "eos='</s>'", "out not empty": "out=",
                "bad line midway": "bad.jsonl:2"}[case]
    assert expected in errors[0], err


def test_a_worker_s_error_comes_back_whole(inputs: list[Path], tmp_path: Path,
                                          make_tokenizer: Callable[..., Path]) -> None:
    """What a worker process returns for bad input (a SpecError does not pickle), run
    here: the flag that stops the other workers is set."""
    from shardlab.data import prepare as p
    from shardlab.data.tokenizer import load_tokenizer

    bad = tmp_path / "bad.jsonl"
    bad.write_text("[]\n")
    stop = threading.Event()
    p._init_worker(queue.Queue(), stop)
    tf = load_tokenizer(make_tokenizer("gpt2"))
    record = p._run_job(p.Job(0, str(bad), tf, "uint16", "text", str(tmp_path)))
    assert record["error"][0] == "input" and stop.is_set()


def test_sigterm_stops_and_writes_nothing(inputs: list[Path], tmp_path: Path,
                                          make_tokenizer: Callable[..., Path],
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import signal

    from shardlab.data import sources

    real = sources.documents

    def documents(*args: Any) -> Any:
        for i, batch in enumerate(real(*args)):
            if i == 1:  # midway through the first file
                os.kill(os.getpid(), signal.SIGTERM)
            yield batch

    monkeypatch.setattr(sources, "READ_BYTES", 1024)
    monkeypatch.setattr("shardlab.data.prepare.documents", documents)
    before = signal.getsignal(signal.SIGTERM)
    code, out, err = prepare(capsys, *map(str, inputs), "--tokenizer",
                             str(make_tokenizer("gpt2")), "--out", str(tmp_path / "out"))
    assert code == 143 and out == "" and "terminated by SIGTERM" in err
    assert list(tmp_path.iterdir()) == []  # nothing written, no hidden temporary left
    assert signal.getsignal(signal.SIGTERM) is before  # the handler put back
