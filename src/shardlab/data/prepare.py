"""``shardlab data prepare``: input files tokenized into shards, one process per file.

Each input file becomes one shard (:mod:`shardlab.data.manifest` describes the folder),
tokenized by one worker process: :func:`prepare` starts ``min(workers, files)`` of them
(spawned, not forked: ``tokenizers`` keeps Rust threads a fork would copy half-made), or
none with one worker. Every input is checked before any is read; a bad line found while
tokenizing stops every worker (they look at a shared flag after each batch) and is
raised as the one SpecError it is. The shards are the same bytes whatever the number of
workers and however often it runs (documents, batches and the chunk cache are
deterministic; each shard is written by one process in order).

:func:`prepare` writes into a folder the caller provides and renames into place
(``shardlab data prepare`` uses :class:`shardlab.hf.folder.OutputFolder`), so a failure
leaves nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing as mp
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

import numpy as np

from shardlab.data.encode import Encoder
from shardlab.data.manifest import (
    DTYPES,
    FORMAT,
    INDEX_DTYPE,
    TOKENIZER,
    VERSION,
    shard_names,
    write_manifest,
)
from shardlab.data.sources import documents
from shardlab.data.tokenizer import TokenizerFile
from shardlab.errors import SpecError

Progress = Callable[[int, int], None]
"""Told ``(input index, bytes of it just read)`` as the work goes on."""
Finished = Callable[[dict[str, Any]], None]
"""Told each shard's record when its file is done."""


@dataclass(frozen=True)
class Job:
    """One input file to tokenize into shard ``index`` of ``folder``."""

    index: int
    source: str
    tokenizer: TokenizerFile
    dtype: str
    text_field: str
    folder: str


class _Stopped(Exception):
    """Another worker failed: this one stops after its current batch."""


def check_inputs(paths: list[str]) -> list[int]:
    """Each input's size in bytes; SpecError naming the first that is missing, not a
    regular file (a folder, a FIFO, /dev/zero), unreadable or empty."""
    sizes = []
    for path in paths:
        try:
            info = os.stat(path)
            if not stat.S_ISREG(info.st_mode):
                raise SpecError("input", path, "must be a text or JSONL file (this is a "
                                "folder or a special file)")
            with open(path, "rb"):
                pass
        except OSError as e:
            raise SpecError("input", path, f"must be a readable file ({e.strerror or e})"
                            ) from None
        if info.st_size == 0:
            raise SpecError("input", path, "is empty")
        sizes.append(info.st_size)
    return sizes


def choose_dtype(dtype: str, vocab_size: int, tokenizer: str) -> str:
    """``dtype`` ("auto": uint16 when the ids fit, else uint32), checked to hold
    ``vocab_size`` ids."""
    if dtype == "auto":
        return "uint16" if vocab_size <= 1 << 16 else "uint32"
    if dtype not in DTYPES:
        raise SpecError("dtype", dtype, f"must be one of auto, {', '.join(DTYPES)}")
    ids = int(np.iinfo(DTYPES[dtype]).max) + 1
    if vocab_size > ids:
        raise SpecError("dtype", dtype, f"holds {ids:,} ids; {tokenizer} has "
                        f"{vocab_size:,}: use uint32 (or auto)")
    return dtype


def tokenize_file(job: Job, progress: Callable[[int], None],
                  stop: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """Tokenize ``job.source`` into its shard's two files; the shard's manifest record.
    ``progress`` is told the bytes read after each batch; ``stop`` is asked then."""
    start = time.perf_counter()
    encoder = Encoder(job.tokenizer)
    name, index = shard_names(job.index)
    item = np.dtype(DTYPES[job.dtype])
    sums = {"file": hashlib.sha256(), "index": hashlib.sha256()}
    tokens = docs = empty = 0
    folder = Path(job.folder)
    with open(folder / name, "wb") as out, open(folder / index, "wb") as idx:
        first = np.zeros(1, INDEX_DTYPE).tobytes()
        idx.write(first)
        sums["index"].update(first)
        for batch, n_bytes, skipped in _read(job):
            ids, lengths = encoder.encode(batch)
            data = ids.astype(item).tobytes()
            ends = (tokens + np.cumsum(lengths)).astype(INDEX_DTYPE).tobytes()
            out.write(data)  # an OSError here is the output's: the caller names the folder
            idx.write(ends)
            sums["file"].update(data)
            sums["index"].update(ends)
            tokens, docs, empty = tokens + len(ids), docs + len(lengths), empty + skipped
            progress(n_bytes)
            if stop():
                raise _Stopped
    return {"source": job.source, "source_bytes": os.path.getsize(job.source),
            "tokens": tokens, "documents": docs, "empty_skipped": empty,
            "file": name, "file_sha256": sums["file"].hexdigest(),
            "index": index, "index_sha256": sums["index"].hexdigest(),
            "encoder": "cached" if encoder.cached else "tokenizers",
            "encoder_note": encoder.note or job.tokenizer.cached,
            "seconds": time.perf_counter() - start}


def _read(job: Job) -> Iterator[tuple[list[str], int, int]]:
    """:func:`~shardlab.data.sources.documents` of the job's input, an OSError reading it
    (a disk error, a file removed meanwhile) a SpecError naming the input."""
    batches = documents(job.source, job.text_field)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except OSError as e:
            raise SpecError("input", job.source, f"cannot be read ({e.strerror or e})"
                            ) from None
        yield batch


def prepare(inputs: list[str], tf: TokenizerFile, folder: str | os.PathLike[str],
            dtype: str, text_field: str = "text", workers: int = 1,
            progress: Progress = lambda i, n: None,
            finished: Finished = lambda record: None) -> dict[str, Any]:
    """Tokenize ``inputs`` into ``folder`` (which exists and is empty) with ``workers``
    processes; the manifest written there (as :func:`~shardlab.data.manifest.write_manifest`
    returns it). ``dtype``: auto, uint16 or uint32 (:func:`choose_dtype`)."""
    start = time.perf_counter()
    check_inputs(inputs)
    dtype = choose_dtype(dtype, tf.vocab_size, tf.path)
    Path(folder, TOKENIZER).write_bytes(tf.text.encode("utf-8"))
    jobs = [Job(i, src, tf, dtype, text_field, str(folder)) for i, src in enumerate(inputs)]
    if workers == 1 or len(jobs) == 1:
        records = []
        for job in jobs:
            records.append(tokenize_file(job, lambda n, i=job.index: progress(i, n)))
            finished(records[-1])
    else:
        records = _in_processes(jobs, min(workers, len(jobs)), progress, finished)
    if not sum(r["documents"] for r in records):
        if len(inputs) == 1:
            raise SpecError("input", inputs[0], "holds no document (every text is empty)")
        raise SpecError("input", f"{len(inputs)} files", "hold no document (every text "
                        "is empty)")
    seconds = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in records)
    eos = {"eos": tf.eos, "eos_id": tf.eos_id}
    manifest = {"format": FORMAT, "version": VERSION,
                "tokenizer": {"file": TOKENIZER, "sha256": tf.sha256,
                              "vocab_size": tf.vocab_size, **eos},
                "dtype": dtype, "tokens": tokens,
                "documents": sum(r["documents"] for r in records),
                "shards": [{k: v for k, v in r.items() if k != "seconds"} for r in records]}
    doc = write_manifest(folder, manifest)
    return {**doc, "seconds": seconds, "tokens_per_second": tokens / seconds,
            "workers": min(workers, len(jobs))}


# --- worker processes -------------------------------------------------------------------

_QUEUE: Any = None
_STOP: Any = None


def _init_worker(queue: Any, stop: Any) -> None:
    global _QUEUE, _STOP
    _QUEUE, _STOP = queue, stop


def _run_job(job: Job) -> dict[str, Any]:
    """A worker's job: its record, or the SpecError's parts (an exception with three
    arguments does not survive pickling back)."""
    try:
        return tokenize_file(job, lambda n: _QUEUE.put((job.index, n)), _STOP.is_set)
    except SpecError as e:
        _STOP.set()
        return {"error": (e.field, e.value, e.allowed)}
    except _Stopped:
        return {"stopped": True}
    except BaseException:
        _STOP.set()
        raise


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process for the block (in the main thread), so that the
    worker processes started in it inherit the ignoring (across exec, before Python
    starts): a Ctrl-C reaches this process alone, which stops the workers after their
    current batch, and none of them prints a KeyboardInterrupt traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _in_processes(jobs: list[Job], workers: int, progress: Progress,
                  finished: Finished) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    records: dict[int, dict[str, Any]] = {}
    error: tuple[Any, ...] | None = None

    def drain() -> None:
        while True:
            try:
                progress(*queue.get_nowait())
            except Empty:
                return

    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(queue, stop)) as pool:
        try:
            with _sigint_ignored():  # the workers start ignoring it: Ctrl-C is ours
                pending = {pool.submit(_run_job, job): job for job in jobs}
            while pending:
                done, _ = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                drain()
                for future in done:
                    job = pending.pop(future)
                    if future.cancelled():
                        continue
                    record = future.result()
                    if "error" in record:
                        error = error or record["error"]
                        for other in pending:  # the jobs not started yet never start
                            other.cancel()
                    elif "stopped" not in record:
                        records[job.index] = record
                        finished(record)
        except BaseException:
            stop.set()  # the other workers stop after their current batch
            pool.shutdown(cancel_futures=True)
            raise
    drain()
    if error is not None:
        raise SpecError(*error)
    return [records[j.index] for j in jobs]
