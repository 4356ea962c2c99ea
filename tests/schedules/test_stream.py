"""Every action as JSON: the timeline rows, JSON lines and the Chrome trace, each held to the
events of the timing it writes (and the trace to ``json.dumps`` of the same document)."""

import io
import json
from typing import Any

import pytest

from shardlab.schedules.generators import KINDS, build
from shardlab.schedules.simulate import Durations, Timing, simulate
from shardlab.schedules.stream import (
    FORMATS,
    timeline,
    write_actions,
    write_chrome_trace,
    write_jsonl,
)

UNEVEN = Durations(0.3, 0.7, 0.11, 0.05)
"""Durations whose sums are not round numbers, so every float's digits are written."""


def _timed(kind: str) -> Timing:
    v = 3 if kind == "interleaved-1f1b" else None
    return simulate(build(kind, 3, 6, v), UNEVEN)


def _rows(t: Timing) -> list[list[dict[str, Any]]]:
    """The timeline as the events give it, one dict per action."""
    chunk = t.schedule.chunk_of_stage
    return [[{"start": e.start, "end": e.end, "kind": e.action.kind,
              "microbatch": e.action.microbatch, "stage": e.action.stage,
              "chunk": chunk[e.action.stage]} for e in ev] for ev in t.events]


def _chrome(t: Timing, us: float) -> dict[str, Any]:
    """The Chrome trace as a document, built from the events one by one."""
    chunk = t.schedule.chunk_of_stage
    meta = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}}
            for r in range(t.schedule.pp)]
    return {"traceEvents": meta + [
        {"name": f"{e.action.kind}{e.action.microbatch}", "cat": e.action.kind, "ph": "X",
         "pid": 0, "tid": e.rank, "ts": e.start * us, "dur": (e.end - e.start) * us,
         "args": {"stage": e.action.stage, "microbatch": e.action.microbatch,
                  "chunk": chunk[e.action.stage]}} for ev in t.events for e in ev],
        "displayTimeUnit": "ms"}


@pytest.mark.parametrize("kind", KINDS)
def test_timeline_and_json_lines_hold_every_event(kind: str) -> None:
    t = _timed(kind)
    assert timeline(t) == _rows(t)
    f = io.BytesIO()
    write_jsonl(t, f)
    lines = f.getvalue().decode().splitlines()
    assert len(lines) == t.schedule.num_actions
    assert [json.loads(line) for line in lines] == [
        {"rank": r, **row} for r, rank in enumerate(_rows(t)) for row in rank]


@pytest.mark.parametrize("kind", KINDS)
def test_the_chrome_trace_is_json_dumps_to_the_byte(kind: str) -> None:
    t = _timed(kind)
    for unit in (1.0, 1e-3):
        f = io.BytesIO()
        write_chrome_trace(t, f, time_unit_s=unit)
        assert f.getvalue() == json.dumps(_chrome(t, 1e6 * unit)).encode()


def test_trace_times_in_microseconds() -> None:
    f = io.BytesIO()
    write_chrome_trace(simulate(build("gpipe", 2, 2)), f, time_unit_s=1e-3)
    first = next(e for e in json.loads(f.getvalue())["traceEvents"] if e["ph"] == "X")
    assert first["ts"] == 0 and first["dur"] == 1000.0


def test_write_actions_picks_the_format_by_suffix() -> None:
    t = simulate(build("1f1b", 2, 2))
    out = {}
    for suffix in FORMATS:
        f = io.BytesIO()
        write_actions(t, suffix, f)
        out[suffix] = f.getvalue()
    assert out[".jsonl"].count(b"\n") == 8 and json.loads(out[".json"])["traceEvents"]
    with pytest.raises(ValueError, match=r"no action format for '\.csv'"):
        write_actions(t, ".csv", io.BytesIO())
