"""``consume --group G`` without ``--queue-id``: a member of the group, as ``rmqpy.PullConsumer`` is.

The consumers of a group share the topic's queues (docs/client.md, "A group of consumers"):
each member reads the queues the group's membership gives it, and a queue changes hands only
once its reader committed and let it go. So two ``consume --group G`` at once, or one beside an
application's ``PullConsumer(group=G)``, never print the same message: each reads its share,
from the group's committed offsets, and commits what it printed when it leaves.

It reads what its queues hold now, up to ``--count``; if that is nothing, it waits up to
``--wait-ms`` for the first message (its pulls parked at the engine), taking up the queues that
members leaving or joining meanwhile move to it, and then reads what is there.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import msgspec

from engine.cli.common import EXIT_FAILED, connect, curve_keys
from rmqpy.message import Message
from rmqpy.pull_consumer import PullConsumer
from rmqpy.raw import Channel

POLL_STEP_MS = 50  # a poll that finds nothing for this long asks whether the member's queues are read to their end
PULL_WAIT_MS_MAX = 30_000  # the longest a pull waits at the engine (PullConsumer's max_wait_ms)


def consume_as_member(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """Up to ``--count`` messages of the queues this member of ``--group`` holds; committed when it leaves."""
    assert args.group and args.queue_id is None, "a member reads the group's share, not one queue"
    with connect(args, timeout_ms=args.timeout_ms, kind=Channel) as client:
        if args.topic not in {t["topic"] for t in client.list_topics()}:
            print(f"error: topic {args.topic!r} does not exist", file=sys.stderr)
            raise SystemExit(EXIT_FAILED)
        endpoint = client.endpoint
    consumer = PullConsumer(args.group, args.topic, endpoint=endpoint, subscription=args.subscription,
                            batch_size=min(256, args.count), max_wait_ms=max(1, min(args.wait_ms, PULL_WAIT_MS_MAX)),
                            timeout_ms=args.timeout_ms, curve=curve_keys(args))
    with consumer:  # leaving the block commits what was handed out, then leaves the group
        messages = _gather(consumer, args.count, args.wait_ms, args.timeout_ms)
    return [msgspec.structs.asdict(m) for m in messages], []


def _gather(consumer: PullConsumer, count: int, wait_ms: int, timeout_ms: int) -> list[Message]:
    """Poll until ``count`` messages, or until the member's queues are read to their end once a
    message came or ``wait_ms`` passed; bounded by ``wait_ms`` plus ``timeout_ms`` (pulls that
    never come back)."""
    messages: list[Message] = []
    started = time.monotonic()
    waited_s, bound_s = wait_ms / 1000, (wait_ms + timeout_ms) / 1000
    while len(messages) < count:
        batch = consumer.poll(POLL_STEP_MS, max_messages=count - len(messages))
        messages.extend(batch)
        if batch:
            continue
        elapsed_s = time.monotonic() - started
        if (messages or elapsed_s >= waited_s) and not any(consumer.lag().values()):
            break
        if elapsed_s >= bound_s:
            break
    return messages
