"""Every command, random flags and values: exit 0 or 2, no traceback, one line for bad input,
``--json`` stdout empty or one document, nothing written when refused.

Hypothesis draws a command, then flags from the command's own parser (so new flags are
fuzzed as soon as they exist) with values at the edges: numbers (0, -1, 1e30, nan, inf, a
fraction), odd strings (empty, spaces, 10,000 characters, non-ASCII, shell syntax), and
paths (missing, a folder, an empty, a binary, a huge sparse and a special file). It runs
in this process through :func:`shardlab.cli.main`; anything that would start ranks,
simulate devices, measure this CPU or draw charts is replaced by a stand-in that stops
there, since only what happens before that is checked here. Runs 500 cases by default
(about 30 s); ``SHARDLAB_FUZZ_EXAMPLES=5000`` runs a longer one.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import traceback
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardlab.cli import build_parser, main

EXAMPLES = int(os.environ.get("SHARDLAB_FUZZ_EXAMPLES", "500"))


class Started(Exception):
    """A stand-in for work the fuzzer does not do: the command got past every check."""


def _stop(*_: Any, **__: Any) -> Any:
    raise Started


STAND_INS = [
    ("shardlab.distributed.launch", "launch"),
    ("shardlab.train.progress", "launch"),  # taken by name when train.progress loads
    ("shardlab.verify.runner", "launch"),
    ("shardlab.sim.run", "simulate_run"),
    ("shardlab.calibrate.runtime", "measure_machine"),
    ("shardlab.report.charts", "render"),
    ("shardlab.hf.weights", "export"),
    ("shardlab.hf.weights", "import_hf"),
    ("shardlab.train.reference", "reference_run"),
    ("shardlab.dryrun.pool", "run_roles"),
    ("shardlab.dryrun.pool", "run_many"),
]


def commands() -> dict[str, list[argparse.Action]]:
    """Each sub-command (report's kinds as "report budget", ...) and its actions."""
    out: dict[str, list[argparse.Action]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[" ".join(prefix)] = [a for a in parser._actions
                                     if not isinstance(a, argparse._HelpAction)]
            return
        for name, sub in subs[0].choices.items():
            walk(sub, [*prefix, name])

    walk(build_parser(), [])
    return out


COMMANDS = commands()
NUMBERS = ["0", "1", "2", "3", "-1", "8", "64", "1e30", "-1e30", "nan", "inf", "0.5", "1e-30",
           "1e9", "007", "2.0"]
WORDS = ["", " ", "x" * 10_000, "gpt2", "llama-3-8b", "h100", "cpu", "fsdp", "1f1b",
         "dp=2 tp=2", "dp=8 dp=4", "sp=banana", "naïve ∑", "$(rm -rf /)", "--", "-1", "a,b",
         "1,2", "bf16", "none"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Paths of every awkward kind, made once."""
    root = tmp_path_factory.mktemp("fuzzfiles")
    (root / "folder").mkdir()
    (root / "empty.json").write_text("")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (root / "text.json").write_text('{"model_type": "llama", "hidden_size": 1e30}')
    with open(root / "huge.json", "wb") as f:
        f.truncate(2**33)  # 8 GiB, sparse: reading it whole must never be tried
    return [str(root / n) for n in ("folder", "empty.json", "binary.bin", "text.json",
                                    "huge.json", "missing.json")] + ["/dev/zero", "/", "."]


def argv_strategy(paths: list[str]) -> st.SearchStrategy[list[str]]:
    values = st.sampled_from(NUMBERS) | st.sampled_from(WORDS) | st.sampled_from(paths)

    @st.composite
    def build(draw: Any) -> list[str]:
        command = draw(st.sampled_from(sorted(COMMANDS)))
        actions = COMMANDS[command]
        argv = command.split()
        for action in draw(st.lists(st.sampled_from(actions), max_size=5)) if actions else []:
            # A flag's own choices half the time, so the checks behind the parser are reached.
            value = (st.sampled_from(sorted(map(str, action.choices))) | values
                     if action.choices else values)
            if action.option_strings:
                argv.append(draw(st.sampled_from(action.option_strings)))
                if action.nargs != 0:
                    argv.append(draw(value))
            else:
                argv.append(draw(value))
        if draw(st.booleans()):
            argv.append("--json")
        return argv

    return build()


CASE_SECONDS = 10
"""A case still running after this long is a finding: what is absurd must be refused at once,
what is merely long must show progress (and no case here does real work)."""


class TooLong(Exception):
    """A case ran past :data:`CASE_SECONDS`."""


def _too_long(*_: Any) -> None:
    raise TooLong


def run(argv: list[str]) -> tuple[int | str, str, str]:
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _too_long)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: int | str = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        except Started:
            code = "started"
        except TooLong:
            code = f"still running after {CASE_SECONDS} s"
        except BaseException:  # what the user would see as a traceback
            code = "traceback"
            err.write(traceback.format_exc())
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


def listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def sandbox(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
            ) -> Path:
    """A working folder and SHARDLAB_HOME of its own; no real work can start."""
    import importlib
    import pkgutil

    import shardlab

    # Every module imported before the stand-ins go in: a module first imported while they
    # are in place would keep a stand-in it took by name (`from ... import launch`) after
    # the test, and the rest of the suite would start nothing.
    for info in pkgutil.walk_packages(shardlab.__path__, "shardlab."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    cwd = tmp_path_factory.mktemp("fuzzcwd")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("SHARDLAB_HOME", str(cwd / "home"))
    for module, name in STAND_INS:
        monkeypatch.setattr(importlib.import_module(module), name, _stop)
    return cwd


def test_the_commands_are_all_fuzzed() -> None:
    assert {"budget", "plan", "schedule", "simulate", "train", "verify", "models", "hardware",
            "demo", "export", "import", "report budget", "report plan", "report run",
            "dryrun", "report dryrun", "data prepare"} <= set(COMMANDS)


def test_random_command_lines(files: list[str], sandbox: Path) -> None:
    seen: list[tuple[list[str], Any]] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(argv_strategy(files))
    def case(argv: list[str]) -> None:
        before = listing(sandbox)
        code, out, err = run(argv)
        seen.append((argv, code))
        shown = " ".join(a if len(a) < 60 else a[:60] + "..." for a in argv)
        assert code != "traceback", f"shardlab {shown}\n{err[-3000:]}"
        assert code in (0, 2, "started"), f"shardlab {shown}: exit {code}\n{err[-2000:]}"
        assert "Traceback" not in err, f"shardlab {shown}\n{err[-3000:]}"
        if code == 2:
            assert err.count("\n") <= 1, f"shardlab {shown}: {err[-2000:]}"
            assert listing(sandbox) == before, f"shardlab {shown} wrote files and exit 2"
        if "--json" in argv and code == 0 and out.strip():
            json.loads(out)  # one document, nothing else

    case()
    refused = sum(1 for _, c in seen if c == 2)
    assert len(seen) >= min(EXAMPLES, 500) and refused > 0
