"""How long a consumer group takes to share out again the queues of a member that dies or closes.

    python scripts/bench_rebalance.py                 # 5 kills, 5 closes
    python scripts/bench_rebalance.py --kills 20 --closes 20

One engine (its default ``consumer_session_timeout_ms``, 6 s, unless ``--session-ms``), a
topic of 8 queues, and three member processes of one group (``harness/group_member.py``:
rmqpy ``PullConsumer``s). A producer sends throughout. Each round takes one member away,
by SIGKILL (a dead member: its session must end) or SIGTERM (a member that closes and says
so), and measures the time until the other two hold every queue between them; then a new
member starts and the round waits until the three share the queues again. At the end,
every message sent must have been read by some member (nothing lost), and the messages
read twice are counted: a queue changes hands only once its member let it go (committing
first) or died, so they are the messages a killed member had read and not committed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rmqpy
from engine.config import StoreConfig
from harness.group_member import MemberProcesses
from supervisor.launcher import EngineProcess

TOPIC, QUEUES = "rebalanced", 8


def wait(condition: object, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not condition():  # type: ignore[operator]
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"{what}: not within {timeout_s} s")
        time.sleep(0.01)
    return time.monotonic() - start


def produce(endpoint: str, stop: threading.Event, sent: list[str]) -> None:
    with rmqpy.Producer(endpoint) as producer:
        while not stop.is_set():
            body = f"m-{len(sent)}"
            producer.send(TOPIC, body.encode())
            sent.append(body)
            stop.wait(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--closes", type=int, default=5)
    parser.add_argument("--session-ms", type=int, default=StoreConfig().consumer_session_timeout_ms)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as scratch:
        config = StoreConfig.test_min().replace(consumer_session_timeout_ms=args.session_ms)
        with EngineProcess(Path(scratch) / "store", config=config) as engine:
            with engine.client() as client:
                client.create_topic(TOPIC, queue_count=QUEUES)
            members = MemberProcesses(engine.endpoint, "bench", TOPIC, QUEUES, Path(scratch))
            stop, sent = threading.Event(), []
            producer = threading.Thread(target=produce, args=(engine.endpoint, stop, sent))
            try:
                names = ["m0", "m1", "m2"]
                for name in names:
                    members.start(name)
                wait(members.balanced, 30, "three members sharing the queues")
                producer.start()
                times: dict[str, list[float]] = {"kill": [], "close": []}
                rounds = ["kill"] * args.kills + ["close"] * args.closes
                for number, how in enumerate(rounds):
                    gone = names.pop(0)
                    (members.kill if how == "kill" else members.stop)(gone)
                    moved = wait(members.balanced, 60, f"round {number}: the queues of {gone} taken up")
                    times[how].append(moved)
                    print(f"round {number:2d} ({how:5s}): queues moved in {moved * 1000:6.0f} ms", flush=True)
                    names.append(f"m{number + 3}")
                    members.start(names[-1])
                    wait(members.balanced, 60,
                         f"round {number}: the new member's share")
                stop.set()
                producer.join()
                expected = set(sent)
                wait(lambda: expected <= set(members.bodies()), 60, "every message sent read by the group")
                read = members.bodies()
            finally:
                stop.set()
                if producer.is_alive():
                    producer.join()
                members.stop_all()
    print(f"\nsession timeout {args.session_ms} ms; 3 members, {QUEUES} queues; {len(sent):,} messages sent")
    for how, values in times.items():
        if values:
            ms = sorted(v * 1000 for v in values)
            print(f"a member {'killed' if how == 'kill' else 'closing'}: queues moved in median "
                  f"{statistics.median(ms):,.0f} ms (min {ms[0]:,.0f}, max {ms[-1]:,.0f}) over {len(ms)}")
    twice = sum(1 for body in expected if read[body] > 1)
    print(f"lost: {len(expected - set(read))}; read more than once: {twice:,} "
          f"({twice / max(1, len(expected)):.2%}, from the rebalances)")


if __name__ == "__main__":
    main()
