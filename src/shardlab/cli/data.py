"""``shardlab data prepare``: text or JSONL files tokenized into memory-mappable shards.

Every check comes before anything is written: the tokenizer (:mod:`shardlab.data.tokenizer`),
the inputs, the dtype against the vocabulary, the output folder (new or empty, its parent
writable). The shards are then written into a hidden temporary folder renamed into
place at the end (:class:`shardlab.hf.folder.OutputFolder`), so bad input found midway
(a JSONL line without text) leaves nothing. Progress goes to stderr: a bar over the
input bytes where stderr is a terminal, and one line per finished file; ``--json``
prints one document on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from shardlab.cli.args import Parser, positive_int
from shardlab.cli.output import print_json
from shardlab.errors import SpecError
from shardlab.hf.folder import OutputFolder

WORTH_A_PROCESS = 16 * 2**20
"""Input bytes below which the default is one worker, this process: starting a worker
(a fresh interpreter, numpy, tokenizers) takes about 0.5 s here, the time this process
tokenizes some 8 MB of English in."""


def register(sub: Any) -> None:
    """Add the ``data`` sub-command and its action ``prepare``."""
    p = sub.add_parser("data", help="tokenize text or JSONL into shards for train --data",
                       description="Prepare training data: `shardlab data prepare` "
                       "tokenizes files with a local Hugging Face tokenizer.json into "
                       "memory-mappable shards and a manifest (docs/guide/data.md).")
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser,
                               required=True)
    q = actions.add_parser("prepare", help="tokenize files into DIR (shards + manifest)",
                           description="Tokenize INPUT files (text, cut into paragraphs at "
                           "blank lines; or .jsonl, one document per line's text field) "
                           "into DIR: one uint16/uint32 shard and one index of document "
                           "boundaries per file, the tokenizer, and manifest.json. Train on "
                           "it with `shardlab train --data DIR`.")
    q.add_argument("inputs", nargs="+", metavar="INPUT", help="text or .jsonl files")
    q.add_argument("--tokenizer", required=True, metavar="FILE",
                   help="a Hugging Face tokenizer.json, read locally (nothing is downloaded)")
    q.add_argument("--out", required=True, metavar="DIR",
                   help="a new or empty folder, written all at once (nothing on failure)")
    q.add_argument("--dtype", choices=("auto", "uint16", "uint32"), default="auto",
                   help="token id type on disk (auto: uint16 when the vocabulary fits)")
    q.add_argument("--eos", metavar="TOKEN",
                   help="append this token after every document (e.g. <|endoftext|>)")
    q.add_argument("--text-field", default="text", metavar="NAME",
                   help="the JSONL field holding a document's text (default text)")
    q.add_argument("--workers", type=positive_int,
                   help="processes, one file each at a time (default: min(files, CPUs); "
                   "this process alone under 16 MiB of input)")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check everything, tokenize into a temporary folder, rename it into place."""
    try:
        # Imported here: tokenizers (a Rust extension) is for this command alone.
        from shardlab.data.prepare import check_inputs, choose_dtype, prepare
        from shardlab.data.tokenizer import load_tokenizer
    except ModuleNotFoundError as e:
        if e.name != "tokenizers":
            raise
        raise SpecError("tokenizer", args.tokenizer, "needs the `tokenizers` package "
                        "(pip install 'shardlab[torch]')") from None
    tf = load_tokenizer(args.tokenizer, args.eos)
    sizes = check_inputs(args.inputs)
    dtype = choose_dtype(args.dtype, tf.vocab_size, tf.path)
    out = OutputFolder(args.out, field="out")
    workers = args.workers or (1 if sum(sizes) < WORTH_A_PROCESS else os.cpu_count() or 1)
    workers = min(workers, len(args.inputs))
    try:
        with _sigterm_raises(), _progress(sizes) as (progress, finished), out as tmp:
            doc = prepare(args.inputs, tf, tmp, dtype, args.text_field, workers, progress,
                          finished)
    except _Terminated:
        sys.stderr.write("shardlab data: terminated by SIGTERM; the workers stopped and "
                         "nothing was written\n")
        return 128 + signal.SIGTERM
    doc = {"out": str(out.path), **doc}
    if args.json:
        print_json(doc)
    else:
        _print_summary(doc, args.out)
    return 0


class _Terminated(Exception):
    """SIGTERM arrived: unwinds like Ctrl-C (the workers stop, the temporary goes)."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`_Terminated` in this (main) thread for the block."""

    def handler(*_: Any) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _progress(sizes: list[int]) -> Iterator[tuple[Callable[[int, int], None],
                                                   Callable[[dict[str, Any]], None]]]:
    """What :func:`shardlab.data.prepare.prepare` reports, on stderr: a bar over the
    input bytes where stderr is a terminal, and a line per finished file always."""
    console = Console(stderr=True, highlight=False)
    with Progress(TextColumn("tokenizing {task.fields[files]}"), BarColumn(),
                  DownloadColumn(), TransferSpeedColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        count = len(sizes)
        task = bar.add_task("", total=sum(sizes), files=f"0/{count} files")
        done: list[dict[str, Any]] = []

        def progress(_: int, n_bytes: int) -> None:
            bar.advance(task, n_bytes)

        def finished(r: dict[str, Any]) -> None:
            done.append(r)
            bar.update(task, files=f"{len(done)}/{count} files")
            bar.console.print(f"  {r['source']}: {r['documents']:,} documents, "
                              f"{r['tokens']:,} tokens in {r['seconds']:.2f} s "
                              f"({_rate(r['tokens'], r['seconds'])}, {r['encoder']})",
                              markup=False, soft_wrap=True)

        yield progress, finished


def _print_summary(doc: dict[str, Any], shown: str) -> None:
    tok = doc["tokenizer"]
    eos = f", {tok['eos']} (id {tok['eos_id']}) after each document" if tok["eos"] else ""
    print(f"prepared {shown}: {len(doc['shards'])} file(s), {doc['documents']:,} documents, "
          f"{doc['tokens']:,} tokens ({doc['dtype']}, vocabulary {tok['vocab_size']:,}{eos})")
    print(f"{doc['seconds']:.2f} s with {doc['workers']} worker(s): "
          f"{_rate(doc['tokens'], doc['seconds'])}")
    notes = {s["encoder_note"] for s in doc["shards"] if s["encoder"] != "cached"}
    encoder = ("the chunk cache (exact for this byte-level BPE)" if not notes else
               f"tokenizers document by document ({'; '.join(sorted(notes))})")
    print(f"encoder: {encoder}; tokenizer sha256 {tok['sha256'][:16]}...")
    print(f"train on it: shardlab train --data {shown}")


def _rate(tokens: int, seconds: float) -> str:
    """Tokens per second, in M from 0.1 M up."""
    rate = tokens / seconds if seconds > 0 else 0.0
    return f"{rate / 1e6:.2f} M tokens/s" if rate >= 1e5 else f"{rate:,.0f} tokens/s"
