# PYTHON_ARGCOMPLETE_OK (argcomplete's global completion looks for this line)
"""``rmqpy`` and ``python -m engine``: produce, consume, query and inspect from the command line.

    python -m engine produce --topic T --count 10000 --body-size 256 --batch-size 100 --keys --tags TagA
    python -m engine consume --topic T [--queue-id 0] [--offset 0] [--count 100]
                             [--group G] [--subscription "tagA || tagB"] [--wait-ms 5000] [--since-ms T]
    python -m engine query --topic T --key K        |  python -m engine query --id MSGID
    python -m engine topics [--create T --queues 8 | --delete T]
    python -m engine stats --topic T [--group G]    (per-queue offsets, store times, a group's lag)
    python -m engine inspect --store-dir DIR         (offline: segments, records, queues, index, checkpoint)
    python -m engine check --store-dir DIR           (offline: verify every structure against the log)
    python -m engine keygen --dir keys --name server (a CURVE key pair; --server-key/--client-key use them)
    python -m engine acl user add NAME --store-dir DIR (users and policies: who may do what)

Online commands reach the engine at ``--endpoint``, or at the endpoint of the
engine running on ``--store-dir``. ``--json`` prints machine-readable output.
Every command's ``--help`` shows examples; ``rmqpy`` (pyproject.toml's console
script) is the same program, with shell completion through argcomplete.

Here are the parser and the dispatch; each command is a module of this package with its
``add`` (its options and ``--help`` examples) and its handler: ``produce``, ``consume``,
``query``, ``stats``, ``topics``, ``transaction``, ``offline`` (inspect, check, keygen), ``acl``.
``common`` holds what they share: exit codes, the engine's endpoint and client, output.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
from pathlib import Path

import argcomplete

from engine.cli import acl, consume, offline, produce, query, stats, topics, transaction
from engine.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_ENGINE,
    EXIT_OK,
    EXIT_OS_ERROR,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    HELP_FORMAT,
)
from engine.client import ClientError, EngineUnreachable, RequestTimeout
from engine.ipc.endpoints import NotRunning
from engine.version import package_version

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_NO_ENGINE", "EXIT_OK", "EXIT_OS_ERROR",
           "EXIT_TIMEOUT", "EXIT_USAGE", "build_parser", "main"]

# The examples under --help (%(prog)s is how it was run: "rmqpy" or "python -m engine"), and each
# command's in its module, written as a user types them.
_EXAMPLES = """examples:
  %(prog)s topics --create orders --queues 4
  %(prog)s produce --topic orders --count 10000 --batch-size 100 --keys --tags TagA
  %(prog)s consume --topic orders --group billing --wait-ms 5000

Shell completion (bash): eval "$(register-python-argcomplete rmqpy)"

Each command has its own --help with examples. Online commands reach the engine at
--endpoint, or at the endpoint of the engine running on --store-dir; offline ones
(inspect, check, keygen) read or write files only.

Exit status: 0 done, 1 refused or not found, 2 bad command line, 3 no engine answers,
4 no reply in time, 5 a local file error, 130 Ctrl-C (docs/client.md, "Exit codes of rmqpy")."""


def build_parser(prog: str = "python -m engine") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Send, receive and look up messages of a running "
                                     "engine; inspect and check a store's files offline.", epilog=_EXAMPLES,
                                     formatter_class=HELP_FORMAT)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (produce, consume, query, stats, topics, offline, transaction, acl):  # the order --help lists
        command.add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rmqpy`` and ``python -m engine``: the handler's exit code, or one of the EXIT_ codes
    above with one line on stderr, never a traceback."""
    parser = build_parser("rmqpy" if Path(sys.argv[0]).name == "rmqpy" else "python -m engine")
    argcomplete.autocomplete(parser)  # answers a completing shell and exits; otherwise does nothing
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack on stderr
    try:
        args = parser.parse_args(argv)  # --help too may meet a closed pipe
        return int(args.handler(args))
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ClientError, NotRunning, OSError) as exc:
        code = next(code for kind, code in _EXIT_CODES if isinstance(exc, kind))
        try:
            print(f"error: {exc}", file=sys.stderr)
        except BrokenPipeError:
            pass
        return code


# The first match wins: EngineError, FrameTooLarge and the rest of ClientError are refusals.
_EXIT_CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
    ((EngineUnreachable, NotRunning), EXIT_NO_ENGINE), (RequestTimeout, EXIT_TIMEOUT),
    (ClientError, EXIT_FAILED), (OSError, EXIT_OS_ERROR))


def _stdout_closed() -> int:
    """The reader of stdout went away (``| head``): say nothing, and keep Python's flush at exit
    from failing on the closed pipe (the recipe of the signal module's documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE
