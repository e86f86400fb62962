"""``query``: messages looked up by key, by id (offset id or uniq key) or by commit log offset."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_command,
    add_connection_options,
    connect,
    emit,
    message_line,
    non_negative,
    plural,
    positive,
)
from engine.client import EngineError, StoreClient
from engine.store.system_topics import HALF_TOPIC, PROPERTY_REAL_TOPIC, TIMER_TOPIC

EXAMPLES = """examples:
  %(prog)s --topic orders --key key-42
  %(prog)s --id 7F00000100002A9F0000000000000000
  %(prog)s --offset 0 --json                   # the record at commit log offset 0"""


def run(args: argparse.Namespace) -> int:
    with connect(args, timeout_ms=args.timeout_ms) as client:
        if args.id:
            messages = _by_id(client, args)
            if not messages:
                print(f"error: no message has the id {args.id}" + ("" if args.topic else
                      " (a uniq_key is found with --topic)"), file=sys.stderr)
                return EXIT_FAILED
        elif args.offset is not None:
            messages = [client.get_by_offset(args.offset)]
        else:
            if not (args.topic and args.key):
                print("error: give --id, or --topic and --key", file=sys.stderr)
                return EXIT_USAGE
            messages = client.query_by_key(args.topic, args.key, begin_timestamp=args.begin, end_timestamp=args.end,
                                           max_results=args.max_results)
    emit(args, messages, "\n".join([*(message_line(m) for m in messages), plural(len(messages), "message")]))
    return EXIT_OK


def _by_id(client: StoreClient, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The messages with this id: with ``--topic``, first the ones whose ``uniq_key`` it is (the
    id RocketMQ 5 clients and ``produce`` show; 32 hex digits, as an offset id is), then the
    record the id names as an offset id (commit log offset and host), if it is that record's."""
    if args.topic:
        found = [m for m in client.query_by_key(args.topic, args.id, max_results=args.max_results)
                 if m["uniq_key"] == args.id]
        if found:
            return found
        for waiting_in in (TIMER_TOPIC, HALF_TOPIC):  # not delivered yet: its waiting record
            found += [m for m in client.query_by_key(waiting_in, args.id, max_results=args.max_results)
                      if m["uniq_key"] == args.id and m["properties"].get(PROPERTY_REAL_TOPIC) == args.topic]
        if found:
            return found
    try:
        record = client.get_by_id(args.id)
    except EngineError as exc:
        if exc.name == "MESSAGE_NOT_FOUND" or (args.topic and exc.name == "INVALID_MSG_ID"):
            return []
        raise
    return [record] if record["msg_id"] == args.id.upper() else []  # any 32 hex digits name some offset


def add(commands: Any) -> None:
    query = add_command(commands, "query", "look messages up by key, by id or by log offset", EXAMPLES)
    add_connection_options(query)
    query.add_argument("--topic", help="with --key: the topic whose index to search")
    query.add_argument("--key", help="a message key (with --topic)")
    query.add_argument("--id", help="a message id: the offsetMsgId, or with --topic the id a RocketMQ 5 "
                                    "client was given (UNIQ_KEY)")
    query.add_argument("--offset", type=non_negative, metavar="N", help="a commit log offset")
    query.add_argument("--begin", type=non_negative, default=0, metavar="MS",
                       help="with --key: earliest store time, ms since the epoch")
    query.add_argument("--end", type=non_negative, default=0x7FFFFFFFFFFFFFFF, metavar="MS",
                       help="with --key: latest store time, ms since the epoch")
    query.add_argument("--max-results", type=positive, default=64, metavar="N",
                       help="with --key: the most messages to return (default 64)")
    query.set_defaults(handler=run)
