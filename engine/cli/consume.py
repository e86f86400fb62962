"""``consume``: pull messages (every queue long-polled at once), as a member of a group
(``engine/cli/group_consume.py``), or pop and ack them for a group."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from engine.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_cluster_options,
    add_command,
    add_connection_options,
    connect,
    emit,
    message_line,
    non_negative,
    plural,
    positive,
    queue_number,
    wait_time_ms,
)
from engine.cli.group_consume import consume_as_member
from engine.client import ClientError
from rmqpy.raw import Channel

EXAMPLES = """examples:
  %(prog)s --topic orders --queue-id 0 --count 5
  %(prog)s --topic orders --group billing --subscription "paid || refunded" --wait-ms 5000
  %(prog)s --topic orders --group billing --count 500   # run it twice at once: each reads its share of the queues
  %(prog)s --topic jobs --group workers --pop --ack --count 500 --wait-ms 1000"""


def run(args: argparse.Namespace) -> int:
    if args.pop and not args.group:
        print("error: --pop needs --group", file=sys.stderr)
        return EXIT_USAGE
    member = bool(args.group) and not args.pop and args.queue_id is None
    if member and (args.offset or args.since_ms is not None):
        print("error: a member of --group starts each queue at the group's committed offset (or its first "
              "message): --offset and --since-ms need --queue-id", file=sys.stderr)
        return EXIT_USAGE
    gather = _pop_messages if args.pop else consume_as_member if member else _pull_messages
    errors: list[str] = []  # printed after the messages

    def consume_one(one: argparse.Namespace) -> list[dict[str, Any]]:
        messages, refusals = gather(one)
        errors.extend(refusals)
        return messages

    if args.cluster is None:
        messages = consume_one(args)
    else:
        from engine.cli.cluster import cluster_route, consume_sets  # etcd's client only when asked for

        messages = consume_sets(args, cluster_route(args), consume_one)
    if args.pop:
        lines = [f"{message_line(m)} attempt={m['attempt']}" for m in messages]
        verb = "popped and acked" if args.ack else f"popped (invisible for {args.invisible_ms} ms, not acked)"
        emit(args, messages, "\n".join([*lines, f"{plural(len(messages), 'message')} {verb}"]))
    else:
        emit(args, messages, "\n".join([*(message_line(m) for m in messages), plural(len(messages), "message")]))
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    return EXIT_FAILED if errors else EXIT_OK


def _pull_messages(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """Up to --count messages pulled from the engine of ``args``, and why a queue could not be read."""
    with connect(args, timeout_ms=args.timeout_ms, kind=Channel) as client:
        assert isinstance(client, Channel)
        topics = {t["topic"]: t["queue_count"] for t in client.list_topics()}
        if args.topic not in topics:
            print(f"error: topic {args.topic!r} does not exist", file=sys.stderr)
            raise SystemExit(EXIT_FAILED)
        queues = [args.queue_id] if args.queue_id is not None else list(range(topics[args.topic]))
        pulls = _Pulls(client, args)
        for queue_id in queues:
            offset = args.offset
            if args.since_ms is not None:  # query by time: the first message stored at or after it
                offset = client.offset_for_time(args.topic, queue_id, args.since_ms)
            if args.group:
                committed = client.fetch_offset(args.group, args.topic, queue_id)
                offset = committed if committed >= 0 else offset
            pulls.offsets[queue_id] = offset
        started = dict(pulls.offsets)
        for queue_id in queues:  # what is there now, from every queue
            pulls.drain(queue_id)
        if not pulls.messages and args.wait_ms > 0:
            pulls.wait_any([q for q in queues if q not in pulls.overflowed])
        if args.group:
            for queue_id, offset in pulls.offsets.items():
                if queue_id not in pulls.overflowed and offset != started[queue_id]:
                    client.commit_offset(args.group, args.topic, queue_id, offset)
    errors = [f"{args.topic}/{queue_id}: offset {pulls.offsets[queue_id]} is past the end of the queue "
              f"({reply['status']}); its valid offsets are {reply['min_offset']}..{reply['max_offset']}"
              for queue_id, reply in pulls.overflowed.items()]
    return pulls.messages, errors


_PULL_AGAIN = ("FOUND", "NO_MATCHED_MESSAGE", "MESSAGE_WAS_REMOVING", "OFFSET_TOO_SMALL")
_OVERFLOWED = "OFFSET_OVERFLOW_BADLY"


class _Pulls:
    """One consume's pulls: each queue's offset and the messages gathered, up to ``--count``.

    First every queue is read as far as it goes without waiting. Only when that finds nothing
    does ``--wait-ms`` apply, and then to all the queues at once: one parked pull per queue,
    and the first to bring messages ends the wait (queue by queue, an empty topic of N queues
    took N times the wait, and a message on the last queue waited for every queue before it).
    """

    def __init__(self, client: Channel, args: argparse.Namespace) -> None:
        self.client = client
        self.args = args
        self.offsets: dict[int, int] = {}
        self.messages: list[dict[str, Any]] = []
        self.overflowed: dict[int, dict[str, Any]] = {}  # queue -> the pull reply that said so

    def _fields(self, queue_id: int) -> dict[str, Any]:
        return {"topic": self.args.topic, "queue_id": queue_id, "offset": self.offsets[queue_id],
                "max_messages": min(256, self.args.count - len(self.messages)), "max_bytes": 4 * 1024 * 1024,
                "subscription": self.args.subscription}

    def take(self, queue_id: int, reply: dict[str, Any]) -> bool:
        """Keep a pull reply's messages and move the queue's offset; True if the queue may have more."""
        if reply["status"] == _OVERFLOWED:
            self.overflowed[queue_id] = reply
            return False
        self.messages.extend(reply["messages"])
        moved = reply["next_offset"] != self.offsets[queue_id]
        self.offsets[queue_id] = reply["next_offset"]
        return moved and reply["status"] in _PULL_AGAIN

    def drain(self, queue_id: int) -> None:
        while len(self.messages) < self.args.count:
            if not self.take(queue_id, self.client.request("pull", **self._fields(queue_id))):
                return

    def wait_any(self, queues: list[int]) -> None:
        """Park a pull on each queue; return when one brings messages (read the rest of that queue)
        or when ``--wait-ms`` is over."""
        deadline = time.monotonic() + self.args.wait_ms / 1000
        waiting: dict[int, int] = {}  # request id -> queue

        def park(queue_id: int) -> None:
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if wait_ms > 0:
                request_id = self.client.submit("pull", wait_ms=wait_ms, max_wait_ms=wait_ms, **self._fields(queue_id))
                waiting[request_id] = queue_id

        for queue_id in queues:
            park(queue_id)
        while waiting and not self.messages:
            for request_id, outcome in self.client.replies(self.args.timeout_ms + self.args.wait_ms):
                queue_id = waiting.pop(request_id)
                if isinstance(outcome, ClientError):
                    raise outcome
                before = len(self.messages)
                if self.take(queue_id, outcome) and len(self.messages) == before:
                    park(queue_id)  # moved past messages the subscription filters out: wait on
        for queue_id in {m["queue_id"] for m in self.messages}:
            self.drain(queue_id)


def _pop_messages(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """Pop up to --count messages for --group (acked with --ack); stop at the first empty pop."""
    messages: list[dict[str, Any]] = []
    with connect(args, timeout_ms=args.timeout_ms + args.wait_ms) as client:
        while len(messages) < args.count:
            popped = client.pop(args.group, args.topic, queue_id=args.queue_id,
                                max_messages=min(256, args.count - len(messages)), invisible_ms=args.invisible_ms,
                                max_wait_ms=args.wait_ms, subscription=args.subscription)
            if not popped:
                break
            if args.ack:
                failed = client.ack(args.group, popped)
                for refusal in failed:
                    print(f"not acked: {refusal['receipt_handle']}: {refusal['error']['message']}", file=sys.stderr)
            messages.extend(popped)
    return messages, []


def add(commands: Any) -> None:
    consume = add_command(commands, "consume", "pull messages, or pop them (--pop) and ack them (--ack)",
                          EXAMPLES)
    add_connection_options(consume)
    consume.add_argument("--topic", required=True, help="the topic to read")
    consume.add_argument("--queue-id", type=queue_number, metavar="Q",
                         help="one queue (default: all queues of the topic)")
    consume.add_argument("--offset", type=non_negative, default=0, metavar="N",
                         help="the queue offset to start at (default 0; a group's committed offset wins; with "
                              "--group only with --queue-id)")
    consume.add_argument("--since-ms", type=non_negative, metavar="MS",
                         help="start at the first message stored at or after this time (ms since the epoch; a "
                              "group's committed offset wins; with --group only with --queue-id)")
    consume.add_argument("--count", type=positive, default=100, metavar="N",
                         help="the most messages to print (default 100)")
    consume.add_argument("--group",
                         help="consumer group: start at its committed offset, commit where it stopped; without "
                              "--queue-id (and --pop) a member of the group, like rmqpy's PullConsumer: consumes "
                              "run at once share the queues, and none prints a message another printed")
    consume.add_argument("--subscription", default="*", metavar="EXPR",
                         help='tags to receive: "*" or "tagA || tagB" (default *)')
    consume.add_argument("--wait-ms", type=wait_time_ms, default=0, metavar="MS",
                         help="long polling: when no queue has a message, wait this long for the first one "
                              "on any queue (default 0)")
    consume.add_argument("--pop", action="store_true",
                         help="pop for --group: each message is invisible to the group's other pops until acked "
                              "or --invisible-ms passes")
    consume.add_argument("--ack", action="store_true", help="with --pop: acknowledge what was popped")
    consume.add_argument("--invisible-ms", type=non_negative, default=30_000, metavar="MS",
                         help="with --pop: how long a message stays invisible before it is redelivered "
                              "(default 30000)")
    add_cluster_options(consume)
    consume.set_defaults(handler=run)
