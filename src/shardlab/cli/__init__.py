"""``shardlab``: one entry point, one sub-command per job.

Bad input ends with exit code 2 and one line on stderr naming the field, the value
and what is allowed; ``--json`` prints one JSON document on stdout and nothing else.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Sequence

from shardlab import __version__
from shardlab.cli import (
    budget,
    catalogs,
    data,
    demo,
    dryrun,
    export,
    import_cmd,
    launch,
    plan,
    report,
    schedule,
    simulate,
    train,
    verify,
)
from shardlab.cli.args import Parser
from shardlab.errors import SpecError, clip

COMMANDS = (budget, catalogs, plan, schedule, simulate, data, train, launch, dryrun, verify,
            report, demo, export, import_cmd)


def _parser_and_commands() -> tuple[Parser, tuple[str, ...]]:
    """The parser of every sub-command, and the names they registered, in order."""
    parser = Parser(prog="shardlab", description="Plan, understand, check and run the "
                    "parallel training of transformer language models.")
    parser.add_argument("--version", action="version", version=f"shardlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in COMMANDS:
        module.register(sub)
    return parser, tuple(sub.choices)


PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR,
                         errno.ENOENT, errno.EACCES, errno.EROFS})
"""OS errors that say a path given on the command line cannot be used as it is."""


def build_parser() -> Parser:
    """The parser of every sub-command."""
    return _parser_and_commands()[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (2 for bad input)."""
    parser, commands = _parser_and_commands()
    args = parser.parse_args(argv)
    if args.command is None:
        # The names come from the registered sub-commands: a new one is listed by itself.
        sys.stderr.write(f"shardlab: error: a command is required ({', '.join(commands)}); "
                         "see shardlab --help\n")
        return 2
    try:
        return int(args.run(args) or 0)
    except SpecError as e:
        sys.stderr.write(f"shardlab {args.command}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: one line and the shell's code for SIGINT (128 + 2), no traceback.
        sys.stderr.write(f"shardlab {args.command}: interrupted\n")
        if argv is None and threading.current_thread() is threading.main_thread():
            # The program is ending: a second SIGINT (Ctrl-C pressed again, or one that
            # reaches this process late while its ranks stop) would raise inside the
            # interpreter's exit and print "Exception ignored in: <finalize object>" with
            # a cut traceback (seen under load in tests/train/test_stops.py). Only when
            # this is the program itself (argv from the command line), not a caller's
            # main([...]).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        return 130
    except BrokenPipeError:
        # `shardlab ... | head` closed the pipe: not an error. Point stdout at /dev/null so
        # the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:
        # A path the file system refuses that no check of the command caught (too long, a
        # loop of links, not a folder): still one line naming it, never a traceback. Other
        # OS errors are not the user's input and go up as they are.
        if e.errno not in PATH_ERRNOS or e.filename is None:
            raise
        sys.stderr.write(f"shardlab {args.command}: error: path={clip(str(e.filename))!r}: "
                         f"{e.strerror}\n")
        return 2
