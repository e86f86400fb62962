"""One member of a consumer group sharing a topic's queues, as a process of its own.

    python -m harness.group_member ENDPOINT GROUP TOPIC OUT

Consumes with rmqpy's ``PullConsumer`` (a member of GROUP) until SIGTERM, and leaves
two files for whoever watches it (a test, ``scripts/bench_rebalance.py``):

* ``OUT.messages``: one line per message handed to it, ``queue_id queue_offset body``,
  written before the next is taken (so a SIGKILL loses none it finished);
* ``OUT.queues``: the queues it reads now, space-separated, replaced whole on each change.

Each message is committed as soon as it is finished (``commit_every=1``), so a member
killed at any moment leaves its successor at most the message it was on to read again.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path

from rmqpy import PullConsumer


def member_queues(out: Path) -> list[int] | None:
    """What a member last wrote it reads (None: nothing written yet)."""
    try:
        text = out.with_suffix(".queues").read_text()
    except FileNotFoundError:
        return None
    return [int(q) for q in text.split()]


def consumed(out: Path) -> list[tuple[int, int, str]]:
    """Every message a member wrote it was handed: (queue id, queue offset, body)."""
    try:
        lines = out.with_suffix(".messages").read_text().splitlines()
    except FileNotFoundError:
        return []
    rows = [line.split(" ", 2) for line in lines]
    return [(int(q), int(o), body) for q, o, body in rows if body]


def run(endpoint: str, group: str, topic: str, out: Path, stop: threading.Event) -> None:
    queues_file = out.with_suffix(".queues")
    held: list[int] | None = None
    with PullConsumer(group, topic, endpoint=endpoint, commit_every=1, max_wait_ms=200) as consumer, \
            out.with_suffix(".messages").open("a", buffering=1) as log:
        while not stop.is_set():
            for message in consumer.poll(200):
                log.write(f"{message.queue_id} {message.queue_offset} {message.body.decode()}\n")
            if consumer.queue_ids != held:
                held = consumer.queue_ids
                scratch = queues_file.with_suffix(".tmp")
                scratch.write_text(" ".join(map(str, held)))
                os.replace(scratch, queues_file)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("endpoint")
    parser.add_argument("group")
    parser.add_argument("topic")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run(args.endpoint, args.group, args.topic, args.out, stop)


if __name__ == "__main__":
    main()
