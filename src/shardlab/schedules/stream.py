"""Every action of a timed schedule as JSON: rows for a JSON document, or a file written
rank by rank (JSON lines, a Chrome trace).

A large schedule has many actions (interleaved 1F1B on 64 ranks, 2 chunks, 512
micro-batches: 131,072), so nothing here builds one object per action for a file: each
rank's lines are formatted from its columns (:attr:`Schedule.columns`, the times of
:class:`Timing`) and written at once, so memory holds one rank's text, not the file's.
Numbers are written as ``json`` writes them (``repr`` of a float is its shortest exact
form); the times are finite, :func:`simulate` refuses a timeline that is not, and the only
strings are the kinds F, B, I and W, which need no escaping.

Files, by suffix (:data:`FORMATS`):

* ``.jsonl``: one action a line, ``{"rank", "start", "end", "kind", "microbatch",
  "stage", "chunk"}``, rank 0's actions first, each rank's in the order it runs them
  (``pandas.read_json(path, lines=True)``, ``jq``, ``duckdb`` read it as a table);
* ``.json``: Chrome trace-event JSON (``chrome://tracing``, https://ui.perfetto.dev): one
  thread per rank, one complete (``"X"``) slice per action, times in microseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import IO, Any

import numpy as np

from shardlab.schedules.actions import KINDS_OF_ACTION
from shardlab.schedules.simulate import Timing

FORMATS = {".jsonl": "JSON lines, one action a line", ".json": "a Chrome trace"}
"""File suffix -> what :func:`write_actions` writes there."""


def _ranks(t: Timing, start: np.ndarray, end: np.ndarray) -> Iterator[tuple[Any, ...]]:
    """Per rank: its index, then ``start``, ``end`` (per action, in :attr:`Timing.start`'s
    order), kind letter, micro-batch, stage and chunk (index on its rank) as Python lists,
    in the order the rank runs them."""
    s = t.schedule
    c = s.columns
    kind = np.array(KINDS_OF_ACTION)[c.kind]
    chunk = np.asarray(s.chunk_of_stage, dtype=np.int64)[c.stage]
    bounds = c.offsets.tolist()
    for r, (a, b) in enumerate(pairwise(bounds)):
        yield (r, start[a:b].tolist(), end[a:b].tolist(), kind[a:b].tolist(),
               c.microbatch[a:b].tolist(), c.stage[a:b].tolist(), chunk[a:b].tolist())


def timeline(t: Timing) -> list[list[dict[str, Any]]]:
    """Per rank, every action as ``{"start", "end", "kind", "microbatch", "stage",
    "chunk"}``: the ``timeline`` of ``shardlab schedule --json --actions``."""
    return [[{"start": s0, "end": s1, "kind": k, "microbatch": mb, "stage": st, "chunk": ch}
             for s0, s1, k, mb, st, ch in zip(*cols, strict=True)]
            for _, *cols in _ranks(t, t.start, t.end)]


def write_jsonl(t: Timing, f: IO[bytes]) -> None:
    """Every action as one JSON object a line (module docstring), rank by rank."""
    for r, *cols in _ranks(t, t.start, t.end):
        f.write("".join(
            f'{{"rank":{r},"start":{s0!r},"end":{s1!r},"kind":"{k}","microbatch":{mb},'
            f'"stage":{st},"chunk":{ch}}}\n'
            for s0, s1, k, mb, st, ch in zip(*cols, strict=True)).encode())


def write_chrome_trace(t: Timing, f: IO[bytes], time_unit_s: float = 1.0) -> None:
    """Chrome trace-event JSON: one thread per rank, one complete ("X") slice per action.
    Times are multiplied by ``time_unit_s`` to seconds, then written in microseconds. The
    text is ``json.dumps`` of ``{"traceEvents": [...], "displayTimeUnit": "ms"}``, to the
    byte (the tests hold it to that)."""
    us = 1e6 * time_unit_s
    events = [f'{{"name": "thread_name", "ph": "M", "pid": 0, "tid": {r}, '
              f'"args": {{"name": "rank {r}"}}}}' for r in range(t.schedule.pp)]
    f.write(('{"traceEvents": [' + ", ".join(events)).encode())
    sep = ", " if events else ""
    for r, ts, dur, kind, mb, stage, chunk in _ranks(t, t.start * us, (t.end - t.start) * us):
        if ts:
            f.write((sep + ", ".join(
                f'{{"name": "{k}{m}", "cat": "{k}", "ph": "X", "pid": 0, "tid": {r}, '
                f'"ts": {t0!r}, "dur": {d!r}, "args": {{"stage": {st}, "microbatch": {m}, '
                f'"chunk": {ch}}}}}'
                for t0, d, k, m, st, ch in zip(ts, dur, kind, mb, stage, chunk, strict=True)
            )).encode())
            sep = ", "
    f.write(b'], "displayTimeUnit": "ms"}')


def write_actions(t: Timing, suffix: str, f: IO[bytes]) -> None:
    """Write every action in the format of ``suffix`` (a key of :data:`FORMATS`)."""
    if suffix == ".jsonl":
        write_jsonl(t, f)
    elif suffix == ".json":
        write_chrome_trace(t, f)
    else:
        raise ValueError(f"no action format for {suffix!r}; one of {', '.join(FORMATS)}")
