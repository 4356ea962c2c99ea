"""Suite-wide settings: hypothesis without per-example deadlines (2 shared cores are noisy),
and the tiny tokenizers the data tests train here (nothing is downloaded)."""

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

from shardlab.calibrate.store import save_measurement
from shardlab.cli import main
from shardlab.config.measured import SCHEMA

COLLECTED = pytest.StashKey[set[str]]()
"""The node ids this session collected, before any -k/-m deselection
(tests/test_collection.py reads them instead of collecting the suite again)."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[COLLECTED] = {item.nodeid for item in items}

settings.register_profile("shardlab", deadline=None, max_examples=60)
settings.load_profile("shardlab")

EXTRA_TEXT = ["naïve café: 1234 apples, 56 pears!\n\tdon't stop  now\n", "x = f(a, b)  # ∑ 中文\n"]


@pytest.fixture(scope="session")
def make_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``make_tokenizer(kind="gpt2", bos=False)``: the path of a byte-level BPE of 300 ids
    trained on 400 garden documents (0.05 s), with GPT-2's pre-tokenizer or Llama-3's or
    Qwen2's split (``kind``), special tokens ``<|endoftext|>`` (id 0) and ``<s>`` (id 1),
    and with ``bos`` a post-processor that puts ``<s>`` before every document."""
    tokenizers = pytest.importorskip("tokenizers")
    from shardlab.data.tokenizer import LLAMA3_SPLIT, QWEN2_SPLIT
    from shardlab.nn.garden import garden_documents, garden_vocab

    pre, models, processors = (tokenizers.pre_tokenizers, tokenizers.models,
                               tokenizers.processors)
    vocab = garden_vocab()
    corpus = [vocab.decode(d) for d in garden_documents(400, 0)] + EXTRA_TEXT
    root = tmp_path_factory.mktemp("tokenizers")
    made: dict[tuple[str, bool], Path] = {}

    def make(kind: str = "gpt2", bos: bool = False) -> Path:
        if (kind, bos) in made:
            return made[kind, bos]
        tok = tokenizers.Tokenizer(models.BPE())
        if kind == "gpt2":
            tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
        else:
            pattern = {"llama3": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT}[kind]
            tok.pre_tokenizer = pre.Sequence([
                pre.Split(tokenizers.Regex(pattern), behavior="isolated"),
                pre.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = tokenizers.decoders.ByteLevel()
        tok.train_from_iterator(corpus, tokenizers.trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<|endoftext|>", "<s>"], show_progress=False,
            initial_alphabet=pre.ByteLevel.alphabet()))
        if bos:
            tok.post_processor = processors.TemplateProcessing(
                single="<s> $A", special_tokens=[("<s>", 1)])
        path = root / f"{kind}{'-bos' if bos else ''}.json"
        tok.save(str(path))
        made[kind, bos] = path
        return path

    return make


def pytest_configure(config: pytest.Config) -> None:
    """A private SHARDLAB_HOME for the whole session (each xdist worker its own) before any
    fixture runs, module- and session-scoped ones included; :func:`_private_home` then
    gives each test an empty one."""
    os.environ["SHARDLAB_HOME"] = tempfile.mkdtemp(prefix="shardlab-home-")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test`'s two workers share the cores: one torch thread each (torch reads
        # OMP_NUM_THREADS when it loads, and the processes a test starts inherit it), so
        # a worker's matmuls never spin-wait beside the other worker's real ranks (seen:
        # a module's real runs took 212 s instead of 73).
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session's SHARDLAB_HOME."""
    home = os.environ.pop("SHARDLAB_HOME", "")
    if os.path.basename(home).startswith("shardlab-home-"):
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_home(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets an empty SHARDLAB_HOME of its own: none reads or writes this user's
    ``~/.cache/shardlab`` (a stored CPU measurement there once decided a test's outcome);
    a test that needs a stored CPU asks for ``cpu_home``."""
    monkeypatch.setenv("SHARDLAB_HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture
def cpu_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stored measurement of a made-up CPU: `plan --gpu cpu` without timing anything."""
    monkeypatch.setenv("SHARDLAB_HOME", str(tmp_path))
    save_measurement({"schema": SCHEMA, "name": "cpu (measured)",
                      "peak_flops": {"fp32": 1e11, "bf16": 5e10}, "memory_bytes": 8e9,
                      "memory_bandwidth": 2e10, "copy_bandwidth": 1e10, "power_watts": 0,
                      "threads": 2})
    return tmp_path


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    """``shardlab plan ARGV --json`` in this process: its document (exit code 0 asserted)."""
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """``shardlab ARGV`` refused as bad input: exit code 2, one line on stderr, nothing on
    stdout (argparse's own refusals included); the line."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusal of a flag's value
        code = e.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    return err
