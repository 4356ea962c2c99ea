"""``shardlab train --config job.toml``: every train flag in a TOML file, in sections.

The file's keys are the flags' names with ``_`` for ``-`` (``--global-batch`` is
``global_batch``), in five sections: ``[model]`` (MODEL as ``name``, and the shape flags),
``[layout]``, ``[run]``, ``[checkpoint]`` and ``[data]`` (``--data`` as ``source``,
``--bin-dtype``). The keys and their sections come from train's own parser
(:func:`defer_defaults`), so a flag added to train is a key of the file by itself. A flag
given on the command line overrides the file: train's parser gives every flag the default
:data:`NOT_GIVEN`, :func:`apply_job_file` fills what the command line left with the file's
value, then with the flag's real default. A switch the file turns on is turned off again
on the command line with ``--no-FLAG``.

Bad input is one :class:`~shardlab.errors.SpecError` naming the key and its section: a key
or section the file may not hold, a value of the wrong TOML type or out of the flag's range
or choices, a key outside any section. Python reads TOML (``tomllib``); the file is written
by :func:`toml_text`, about 60 lines for the one shape these files have (tables of strings,
integers, floats and booleans), tested against ``tomllib`` rather than a dependency.
"""

from __future__ import annotations

import argparse
import math
import re
import textwrap
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardlab.cli.args import nonneg_float, nonneg_int, positive_float, positive_int
from shardlab.config.files import read_input_text
from shardlab.errors import SpecError, clip

SECTIONS = ("model", "layout", "run", "checkpoint", "data")
"""The file's sections, in the order they are written."""

_GROUP_SECTION = {"model": "model", "layout": "layout", "run": "run", "checkpoints": "checkpoint"}
"""An argparse group of ``shardlab train`` (by the first word of its title) -> section."""

_PLACE = {"model": ("model", "name"), "seq": ("run", "seq"), "data": ("data", "source"),
          "bin_dtype": ("data", "bin_dtype")}
"""Flags whose key or section is not their group's and their own name (by argparse dest)."""

_NOT_IN_FILE = frozenset({"help", "json", "config"})
"""Flags that say how to show the run or where its file is, not what the run is."""


class _NotGiven:
    """The default of every flag the file may set: left by the command line."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()


@dataclass(frozen=True)
class Key:
    """One key of the file: where it is, the flag it stands for, what it may hold."""

    section: str
    name: str
    dest: str  # the flag's argparse dest
    kind: type  # bool, int, float or str: the TOML value it takes
    convert: Any  # the flag's own type (its range check), or None
    choices: tuple[Any, ...] | None
    default: Any  # the flag's default, given when neither the file nor the line sets it
    help: str | None
    flag: str  # "--global-batch" (MODEL for the positional)
    optional_value: bool  # nargs="?" (--resume [STEP]): a string or an integer


_INTS = (positive_int, nonneg_int, int)
_FLOATS = (positive_float, nonneg_float, float)


def _kind(action: argparse.Action) -> type:
    if isinstance(action, argparse._StoreTrueAction):
        return bool
    if hasattr(action.type, "kind"):  # a bounded type of shardlab.cli.args
        return action.type.kind  # type: ignore[union-attr, no-any-return]
    if action.type in _INTS:
        return int
    if action.type in _FLOATS:
        return float
    return str


def _section_of_group(title: str | None) -> str:
    word = (title or "run").split()[0].lower()
    return _GROUP_SECTION.get(word, "run")


def defer_defaults(p: argparse.ArgumentParser) -> None:
    """Make every flag of ``p`` (train's parser, once all its flags are added) a key of the
    file: record its section, type and default in ``p``'s defaults (``job_keys``), give it
    :data:`NOT_GIVEN` as its default, and add ``--no-FLAG`` for each switch. Hidden flags
    (fault injection for tests) keep their defaults and are no keys."""
    keys: dict[str, Key] = {}
    for group in p._action_groups:
        for a in list(group._group_actions):
            if a.dest in _NOT_IN_FILE or a.help == argparse.SUPPRESS:
                continue
            section, name = _PLACE.get(a.dest, (_section_of_group(group.title), a.dest))
            flag = a.option_strings[-1] if a.option_strings else a.dest.upper()
            keys[a.dest] = Key(section, name, a.dest, _kind(a), a.type,
                               tuple(a.choices) if a.choices is not None else None,
                               a.default, a.help, flag,
                               a.nargs == "?" and bool(a.option_strings))
            a.default = NOT_GIVEN
            if isinstance(a, argparse._StoreTrueAction):
                group.add_argument("--no-" + flag[2:], dest=a.dest, action="store_false",
                                   default=NOT_GIVEN, help=argparse.SUPPRESS)
    p.set_defaults(job_keys=keys, **dict.fromkeys(keys, NOT_GIVEN))


def apply_job_file(args: argparse.Namespace) -> None:
    """Fill every flag the command line did not give: from ``--config``'s file when it sets
    it, else with the flag's default. Idempotent; SpecError for a bad file."""
    keys: dict[str, Key] = args.job_keys
    if args.config is not None:
        for dest, value in read_job_file(args.config, keys).items():
            if getattr(args, dest) is NOT_GIVEN:
                setattr(args, dest, value)
    for key in keys.values():
        if getattr(args, key.dest) is NOT_GIVEN:
            setattr(args, key.dest, key.default)


def read_job_file(path: str, keys: dict[str, Key]) -> dict[str, Any]:
    """The flags a job file sets, by argparse dest, each value checked as the flag checks
    it (type, range, choices); SpecError naming the key and its section otherwise."""
    try:
        doc = tomllib.loads(read_input_text("config", path))
    except tomllib.TOMLDecodeError as e:
        raise SpecError("config", path, f"is not TOML: {e}") from None
    where = {(k.section, k.name): k for k in keys.values()}
    home = {k.name: k.section for k in keys.values()}
    values: dict[str, Any] = {}
    for section, table in doc.items():
        if not isinstance(table, dict):
            belongs = f"; put it under [{home[section]}]" if section in home else ""
            raise SpecError(section, table, f"is a key outside any section of {path}{belongs} "
                            f"(sections: {', '.join(SECTIONS)})")
        if section not in SECTIONS:
            raise SpecError("config", path, f"[{section}] is not a section of a job file "
                            f"(sections: {', '.join(SECTIONS)})")
        for name, value in table.items():
            key = where.get((section, name))
            if key is None:
                raise _unknown(section, name, value, path, keys, home)
            values[key.dest] = _checked(key, value)
    return values


def _unknown(section: str, name: str, value: Any, path: str, keys: dict[str, Key],
             home: dict[str, str]) -> SpecError:
    if name in home:
        hint = f"it belongs in [{home[name]}]"
    else:
        hint = "keys: " + ", ".join(k.name for k in keys.values() if k.section == section)
    return SpecError(f"{section}.{name}", value, f"unknown key in [{section}] of {path}; {hint}")


def _checked(key: Key, value: Any) -> Any:
    """``value`` as the flag would hold it, or SpecError naming ``section.name``."""
    field = f"{key.section}.{key.name}"
    kind = key.kind
    if key.optional_value and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # --resume 12: a step, as the command line passes it
    ok = {bool: isinstance(value, bool),
          int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, int | float) and not isinstance(value, bool),
          str: isinstance(value, str)}[kind]
    if not ok:
        what = {bool: "true or false", int: "an integer", float: "a number",
                str: "a string (in double quotes)"}[kind]
        raise SpecError(field, value, f"must be {what} (as {key.flag})")
    if key.choices is not None and value not in key.choices:
        raise SpecError(field, value, f"must be one of {', '.join(map(str, key.choices))}")
    if key.convert is not None:
        text = repr(value) if kind is float else str(value)
        try:
            return key.convert(text)
        except argparse.ArgumentTypeError as e:
            reason = str(e).removeprefix(clip(repr(text))).strip()
            raise SpecError(field, value, reason) from None
    return float(value) if kind is float else value


def job_sections(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every key the namespace sets (flags filled by :func:`apply_job_file`), by section,
    in the parser's order; keys left unset (None) are left out of the file."""
    sections: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for key in args.job_keys.values():
        value = getattr(args, key.dest)
        if value is not None and value is not NOT_GIVEN:
            sections[key.section][key.name] = value
    return sections


def job_text(args: argparse.Namespace, header: Sequence[str]) -> str:
    """The job file of a filled namespace, each key under a comment of its flag's help.
    Before train's checks, which fill in the shape flags' defaults (and a file that names
    a model and gives a shape is refused)."""
    comments = {}
    for k in args.job_keys.values():
        if k.help:
            comments[k.section, k.name] = f"{k.flag}: {k.help}".replace("%%", "%")
        elif k.choices:
            comments[k.section, k.name] = f"{k.flag}: one of {', '.join(map(str, k.choices))}"
    return toml_text(job_sections(args), header, comments)


# -- writing TOML ----------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and control characters escaped
    (TOML 1.0, "Basic strings"); everything else, any Unicode, as it is."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    """A scalar as TOML writes it: true/false, an integer (64-bit), a float that reads back
    bit for bit (``repr``; inf and nan as TOML spells them) or a basic string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"{value} does not fit TOML's 64-bit integers")
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    raise TypeError(f"a job file holds strings, numbers and booleans, not {type(value)}")


def comment_lines(text: str, width: int = 88) -> list[str]:
    """``text`` as ``#`` comment lines of at most ``width`` characters (a longer word
    alone on its line); none for empty text."""
    text = "".join(c if c.isprintable() else " " for c in text)  # TOML comments: no controls
    return ["# " + line for line in textwrap.wrap(text, width - 2, break_long_words=False,
                                                   break_on_hyphens=False)]


def toml_key(name: str) -> str:
    """A bare key when TOML allows one, else a quoted key."""
    return name if _BARE_KEY.fullmatch(name) else toml_string(name)


def toml_text(sections: dict[str, dict[str, Any]], header: Sequence[str] = (),
              comments: dict[tuple[str, str], str] | None = None) -> str:
    """Tables of scalars as a TOML document: ``header`` as comment lines on top, then each
    section with its keys, a key's comment (one line, from ``comments``) above it."""
    lines = [line for item in header for line in comment_lines(item)]
    for section, table in sections.items():
        lines += ["", f"[{toml_key(section)}]"]
        for name, value in table.items():
            note = (comments or {}).get((section, name))
            if note:
                lines += comment_lines(note)
            lines.append(f"{toml_key(name)} = {toml_value(value)}")
    return "\n".join(lines).lstrip("\n") + "\n"
