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
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from rmqpy import PullConsumer

REPO = Path(__file__).resolve().parents[1]


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


class MemberProcesses:
    """Member processes of one group on one topic, each writing what it reads under ``out_dir``."""

    def __init__(self, endpoint: str, group: str, topic: str, queue_count: int, out_dir: Path) -> None:
        self.endpoint, self.group, self.topic, self.queue_count = endpoint, group, topic, queue_count
        self.dir = out_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "harness.group_member", self.endpoint, self.group, self.topic, str(self.dir / name)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        proc.wait(10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def queues(self) -> dict[str, list[int] | None]:
        return {name: member_queues(self.dir / name) for name in self.procs}

    def shared_out(self) -> bool:
        """Every live member wrote its queues, and together they hold each queue once."""
        held = self.queues().values()
        if any(q is None for q in held):
            return False
        return sorted(q for queues in held for q in queues or []) == list(range(self.queue_count))

    def balanced(self) -> bool:
        """Shared out, and by the average allocation: each live member holds its share of the queues."""
        if not self.shared_out():
            return False
        count, total = len(self.procs), self.queue_count
        shares = sorted(total // count + (1 if i < total % count else 0) for i in range(count))
        return sorted(len(q or []) for q in self.queues().values()) == shares

    def bodies(self, names: list[str] | None = None) -> Counter[str]:
        """How often each body was read, by the members named (all that ever ran: None)."""
        counts: Counter[str] = Counter()
        for path in self.dir.glob("*.messages"):
            if names is None or path.stem in names:
                counts.update(body for _q, _o, body in consumed(self.dir / path.stem))
        return counts


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
