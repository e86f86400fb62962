"""``transaction``: commit or roll back a half message, or list those waiting for a decision."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.common import add_command, add_connection_options, connect, emit, printable, wait_time_ms

EXAMPLES = """examples:
  %(prog)s --commit 7F00000100002A9F00000000000A1B2C
  %(prog)s --rollback 7F00000100002A9F00000000000A1B2C
  %(prog)s --checks --producer-group cli-producers --wait-ms 5000"""


def run(args: argparse.Namespace) -> int:
    with connect(args, timeout_ms=args.timeout_ms) as client:
        if args.checks:
            checks = client.transaction_checks(args.producer_group, max_wait_ms=args.wait_ms)
            lines = [f"{c['msg_id']} -> {c['topic']}/{c['queue_id']} checked {c['check_times']} times, "
                     f"body={printable(c['body'])[:60]!r}" for c in checks]
            emit(args, checks, "\n".join(lines) or "no half message waits for a decision")
            return 0
        msg_id, decision = (args.commit, "commit") if args.commit else (args.rollback, "rollback")
        stands = client.end_transaction(msg_id, decision)
    emit(args, {"msg_id": msg_id, "decision": stands}, f"{msg_id}: {stands}")
    return 0


def add(commands: Any) -> None:
    transaction = add_command(commands, "transaction", "decide half messages, or list those waiting for a decision",
                              EXAMPLES)
    add_connection_options(transaction)
    decide = transaction.add_mutually_exclusive_group(required=True)
    decide.add_argument("--commit", metavar="ID", help="commit the half message ID (the id its send printed)")
    decide.add_argument("--rollback", metavar="ID", help="roll back the half message ID")
    decide.add_argument("--checks", action="store_true",
                        help="list the half messages of --producer-group waiting for a decision")
    transaction.add_argument("--producer-group", default="cli-producers", metavar="GROUP",
                             help="with --checks: the producer group whose halves to list (default cli-producers)")
    transaction.add_argument("--wait-ms", type=wait_time_ms, default=0, metavar="MS",
                             help="with --checks: wait this long for one (default 0)")
    transaction.set_defaults(handler=run)
