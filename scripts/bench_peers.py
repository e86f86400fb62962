"""The peers' workload: what a user comparing message stores would run, through each one's own
Python client, in one run on one machine, beside SQLite in WAL mode with synchronous=FULL (a row
per message with the fields a stored message has).

    python scripts/bench_peers.py                    # 100,000 messages
    python scripts/bench_peers.py --million          # and 1,000,000
    python scripts/bench.py --only peers [--million]  # the same, from the suite

Every message is 256 bytes with a key and a tag; a topic has 4 queues. Figures:

* produce in batches of 1000, one batch at a time (how most users call it) and 4 in flight; one
  at a time also as records the client encodes (``codec.batch_records`` in the timed loop), and
  through ``rmqpy.Producer`` (records, and a typed ``SendResult`` per message);
* one durable send at a time (SYNC_FLUSH) and one ASYNC send at a time: p50 and p99;
* consume everything back through the public client (``StoreClient.pull``, 1024 a pull), and on
  the same host over the shared mapped files (``engine.local_reads.LocalReads.pull``), and through
  ``rmqpy.PullConsumer`` both ways (``store_dir`` for the files);
* 1,000 key lookups, one at a time, over the socket and on the same host (``LocalReads``), and
  10,000 over the socket 100 keys a request (``query_by_keys``);
* SIGKILL of each actor kind, 10 times: the worst time until it serves again;
* each actor's share of the engine's CPU over produce and consume (would it scale with cores?);
* references: one ``pwrite`` + ``fdatasync`` of 300 bytes, and a ZeroMQ DEALER/ROUTER echo, one at a time;
* Redis Streams with ``appendfsync always`` (one stream a queue, ``XADD`` pipelined a batch at a
  time, ``XRANGE`` 1024 at a time, single ``XADD`` p50 and p99), when ``redis-server`` is on the
  PATH and the ``redis`` client is installed (``pip install -e .[bench]``): started and stopped here.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import RESULTS, SETTINGS, body_of, engine_config, percentile, pipelined, record, request_frame, setting

from engine import codec
from engine.client import ClientError, StoreClient
from engine.ipc.control import EventStream
from engine.local_reads import LocalReads
from harness.faults import actor_pids
from harness.workload import wait_dispatched
from rmqpy import OutgoingMessage, Producer, PullConsumer
from supervisor.launcher import EngineProcess, free_port

QUEUES = 4
BATCH = 1000
BODY = 256
SINGLES = 1000
LOOKUPS = 1000
KILLS = 10


def messages(first: int, count: int) -> list[dict[str, Any]]:
    return [{"body": body_of(BODY, i), "keys": [f"key-{i}"], "tags": "tag"} for i in range(first, first + count)]


def timed_ms(action: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    action()
    return (time.perf_counter() - t0) * 1000


# -- references ----------------------------------------------------------------------------------

def ref_fdatasync(workdir: Path) -> None:
    path = workdir / "fdatasync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, 4 << 20)
    os.fsync(fd)
    latencies = []
    for i in range(2000):
        latencies.append(timed_ms(lambda i=i: (os.pwrite(fd, b"x" * 300, i * 300), os.fdatasync(fd))))
    os.close(fd)
    path.unlink()
    record("reference pwrite 300 B + fdatasync p50", [percentile(latencies, 0.5)], "ms")
    record("reference pwrite 300 B + fdatasync p99", [percentile(latencies, 0.99)], "ms")


def ref_zmq_round_trip() -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            if router.poll(50):
                router.send_multipart(router.recv_multipart())

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    frame = request_frame("send", 1, topic="t", messages=messages(0, 1))
    latencies = [timed_ms(lambda: (dealer.send(frame), dealer.recv())) for _ in range(3000)]
    stop.set()
    thread.join()
    dealer.close()
    router.close()
    record("reference ZeroMQ echo round trip, one at a time, p50", [percentile(latencies[500:], 0.5)], "ms")


# -- SQLite --------------------------------------------------------------------------------------

SQLITE_COLUMNS = ("topic TEXT, queue INTEGER, queue_offset INTEGER, commit_log_offset INTEGER, store_size INTEGER, "
                  "body_crc INTEGER, flag INTEGER, sys_flag INTEGER, born_timestamp INTEGER, store_timestamp INTEGER, "
                  "born_host TEXT, store_host TEXT, msg_id TEXT, tags TEXT, key TEXT, uniq_key TEXT, "
                  "properties TEXT, body BLOB")
"""A row carries what a stored message carries (the fields a pull returns), so that a consume
from SQLite materializes as much as the engine's does: topic, queue, offsets, sizes, CRC,
flags, timestamps, hosts, tags, keys, properties, body."""


def sqlite_row(i: int, queue_offsets: list[int]) -> tuple[Any, ...]:
    queue = i % QUEUES
    queue_offsets[queue] += 1
    uniq = f"{i:032X}"
    return ("peers", queue, queue_offsets[queue] - 1, i * 400, 400, i & 0x7FFFFFFF, 0, 0, 1_700_000_000_000 + i,
            1_700_000_000_000 + i, "127.0.0.1:50000", "127.0.0.1:10911", f"7F000001{i:024X}", "tag", f"key-{i}",
            uniq, '{"UNIQ_KEY":"' + uniq + '"}', body_of(BODY, i))


def sqlite_peer(workdir: Path, total: int) -> None:
    path = workdir / f"peer-{total}.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(f"CREATE TABLE m (id INTEGER PRIMARY KEY, {SQLITE_COLUMNS})")
    db.execute("CREATE INDEX m_key ON m (key)")
    names = [column.split()[0] for column in SQLITE_COLUMNS.split(", ")]
    insert = f"INSERT INTO m ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
    queue_offsets = [0] * QUEUES
    t0 = time.perf_counter()
    for n in range(total // BATCH):
        rows = [sqlite_row(i, queue_offsets) for i in range(n * BATCH, (n + 1) * BATCH)]
        db.execute("BEGIN")
        db.executemany(insert, rows)
        db.execute("COMMIT")
    record(f"SQLite FULL produce {total:,} batch={BATCH} (a message's fields)", [total / (time.perf_counter() - t0)],
           "msg/s")
    t0 = time.perf_counter()
    count = sum(1 for _ in db.execute("SELECT * FROM m ORDER BY queue, id"))
    record(f"SQLite consume all {total:,} (a message's fields)", [count / (time.perf_counter() - t0)], "msg/s")
    if total <= 100_000:
        latencies = [timed_ms(lambda i=i: db.execute(insert, sqlite_row(total + i, queue_offsets)))
                     for i in range(SINGLES)]
        record("SQLite FULL single insert p50", [percentile(latencies, 0.5)], "ms")
        record("SQLite FULL single insert p99", [percentile(latencies, 0.99)], "ms")
        rng = random.Random(3)
        t0 = time.perf_counter()
        for _ in range(LOOKUPS):
            db.execute("SELECT * FROM m WHERE key = ?", (f"key-{rng.randrange(total)}",)).fetchall()
        record("SQLite key lookups one at a time", [LOOKUPS / (time.perf_counter() - t0)], "lookups/s")
    db.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def redis_peer(workdir: Path, total: int) -> None:
    """Redis Streams, every write fsynced before its reply (``appendfsync always``)."""
    try:
        import redis
    except ImportError:
        print("Redis peer skipped: the redis client is not installed (pip install -e .[bench])")
        return
    server = shutil.which("redis-server")
    if server is None:
        print("Redis peer skipped: redis-server is not on the PATH (apt-get install redis-server)")
        return
    directory = workdir / f"redis-{total}"
    directory.mkdir()
    port = free_port()
    process = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                                "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # the server is starting: nothing to wait on but its port
        t0 = time.perf_counter()
        for n in range(total // BATCH):
            pipe = client.pipeline(transaction=False)
            for i in range(n * BATCH, (n + 1) * BATCH):
                pipe.xadd(f"q{i % QUEUES}", {"key": f"key-{i}", "tags": "tag", "body": body_of(BODY, i)})
            pipe.execute()
        record(f"Redis always produce {total:,} batch={BATCH}", [total / (time.perf_counter() - t0)], "msg/s")
        t0 = time.perf_counter()
        count = 0
        for queue in range(QUEUES):
            start = "-"
            while entries := client.xrange(f"q{queue}", min=start, count=1024):
                count += len(entries)
                start = "(" + entries[-1][0].decode()
        record(f"Redis XRANGE consume all {total:,}", [count / (time.perf_counter() - t0)], "msg/s")
        if total <= 100_000:
            latencies = [timed_ms(lambda i=i: client.xadd("one", {"key": f"one-{i}", "body": body_of(BODY, i)}))
                         for i in range(SINGLES)]
            record("Redis always single XADD p50", [percentile(latencies, 0.5)], "ms")
            record("Redis always single XADD p99", [percentile(latencies, 0.99)], "ms")
        client.close()
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


# -- the engine ----------------------------------------------------------------------------------

class CpuMeter:
    """CPU seconds each actor process spent between ``start`` and ``stop``."""

    def __init__(self, engine: EngineProcess) -> None:
        self.processes = {name: psutil.Process(pid) for name, pid in engine.actor_pids().items()}
        self.before: dict[str, float] = {}
        self.spent: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {name: sum(p.cpu_times()[:2]) for name, p in self.processes.items()}

    def start(self) -> None:
        self.before = self._now()

    def stop(self) -> None:
        after = self._now()
        for name, value in after.items():
            self.spent[name] = self.spent.get(name, 0.0) + value - self.before[name]


DISPATCHERS = ("reput", "index")  # and every "owner-<k>": the actors that dispatch each record


def cpu_per_message(engine: EngineProcess, flush_mode: str, total: int) -> None:
    """The engine's CPU (every process, user and system) per message produced in batches of
    ``BATCH`` and dispatched, and the dispatching actors' share of it, in µs: the messages sent
    as maps (``StoreClient.send``), then as records the client encodes (``rmqpy.Producer``)."""
    meter = CpuMeter(engine)
    with engine.client(timeout_ms=60_000) as client:
        topic = f"cpu-{flush_mode}"
        client.create_topic(topic, queue_count=QUEUES)
        wait_dispatched(client, timeout_ms=60_000)
        meter.start()
        for first in range(0, total, BATCH):
            client.send(topic, messages(first, BATCH))
        wait_dispatched(client, timeout_ms=300_000)
        meter.stop()
    spent = meter.spent
    dispatch = sum(v for name, v in spent.items() if name in DISPATCHERS or name.startswith("owner-"))
    record(f"engine {flush_mode} CPU per message produced and dispatched (all processes)",
           [sum(spent.values()) / total * 1e6], "us")
    record(f"engine {flush_mode} CPU per message dispatched (reput, owners, index)", [dispatch / total * 1e6], "us")
    for name in ("writer", "front", "reput", "index"):
        record(f"engine {flush_mode} CPU per message: {name}", [spent[name] / total * 1e6], "us")
    record(f"engine {flush_mode} CPU per message: owners", [sum(v for name, v in spent.items()
                                                                  if name.startswith("owner-")) / total * 1e6], "us")
    # the same produced by rmqpy.Producer: batches the client encodes as records (its own CPU not counted)
    typed = [[OutgoingMessage(body=m["body"], keys=tuple(m["keys"]), tags=m["tags"]) for m in messages(first, BATCH)]
             for first in range(0, total, BATCH)]
    meter = CpuMeter(engine)
    with engine.client(timeout_ms=60_000) as client, Producer(engine.endpoint, timeout_ms=60_000) as producer:
        client.create_topic(f"{topic}-producer", queue_count=QUEUES)
        wait_dispatched(client, timeout_ms=60_000)
        meter.start()
        for batch in typed:
            producer.send_batch(f"{topic}-producer", batch)
        wait_dispatched(client, timeout_ms=300_000)
        meter.stop()
    spent = meter.spent
    record(f"engine {flush_mode} CPU per message produced by rmqpy.Producer (records) and dispatched",
           [sum(spent.values()) / total * 1e6], "us")
    record(f"engine {flush_mode} CPU per message produced by rmqpy.Producer: writer", [spent["writer"] / total * 1e6],
           "us")


def consume_all(pull: Callable[[int, int], tuple[int, int]], total: int) -> float:
    """Read every queue from its start with ``pull(queue_id, offset) -> (messages, next offset)``: msg/s."""
    t0 = time.perf_counter()
    count = 0
    for queue_id in range(QUEUES):
        offset = 0
        while True:
            found, offset = pull(queue_id, offset)
            if not found:
                break
            count += found
    assert count == total, (count, total)
    return count / (time.perf_counter() - t0)


def consume_iterating(engine: EngineProcess, group: str, topic: str, total: int, **options: Any) -> float:
    """A consumer group's new member iterating over every message, one by one, from its opening to
    its ``total``-th message: msg/s."""
    t0 = time.perf_counter()
    count = 0
    with PullConsumer(group, topic, endpoint=engine.endpoint, batch_size=1024, auto_commit=False,
                      idle_timeout_ms=10_000, **options) as consumer:
        for _ in consumer:
            count += 1
            if count == total:
                seconds = time.perf_counter() - t0
                break
    assert count == total, (count, total)
    return total / seconds


def engine_peer(engine: EngineProcess, flush_mode: str, total: int, meter: CpuMeter | None) -> None:
    label = f"engine {flush_mode} {total:,}"
    topic = f"peers-{flush_mode}-{total}"
    with engine.client(timeout_ms=60_000) as client:
        client.create_topic(topic, queue_count=QUEUES)
        if meter:
            meter.start()
        t0 = time.perf_counter()
        for first in range(0, total, BATCH):
            client.send(topic, messages(first, BATCH))
        record(f"{label} produce batch={BATCH}, 1 in flight", [total / (time.perf_counter() - t0)], "msg/s")
        typed = [[OutgoingMessage(body=m["body"], keys=tuple(m["keys"]), tags=m["tags"])
                  for m in messages(first, BATCH)] for first in range(0, total, BATCH)]
        wait_dispatched(client, timeout_ms=300_000)  # each produce starts with the dispatch caught up
        t0 = time.perf_counter()
        for n, batch in enumerate(typed):  # encoded here, in the timed loop, as a producer would
            client.request("send", topic=f"{topic}-records", records=codec.batch_records(batch, "BE", n * BATCH)[0])
        record(f"{label} produce batch={BATCH}, 1 in flight (records)", [total / (time.perf_counter() - t0)], "msg/s")
        wait_dispatched(client, timeout_ms=300_000)
        with Producer(engine.endpoint, timeout_ms=60_000) as producer:
            t0 = time.perf_counter()
            for batch in typed:
                producer.send_batch(f"{topic}-producer", batch)
            record(f"{label} produce batch={BATCH}, 1 in flight (rmqpy.Producer: records, typed results)",
                   [total / (time.perf_counter() - t0)], "msg/s")
        frames = [request_frame("send", n, topic=f"{topic}-4", messages=messages(n * BATCH, BATCH))
                  for n in range(total // BATCH)]
        seconds, replies = pipelined(engine.endpoint, frames, inflight=4)
        assert all(r["ok"] for r in replies)
        record(f"{label} produce batch={BATCH}, 4 in flight", [total / seconds], "msg/s")
        wait_dispatched(client, timeout_ms=300_000)

        def over_socket(queue_id: int, offset: int) -> tuple[int, int]:
            reply = client.pull(topic, queue_id, offset, max_messages=1024)
            return len(reply["messages"]), reply["next_offset"]

        record(f"{label} consume all (StoreClient.pull)", [consume_all(over_socket, total)], "msg/s")
        with LocalReads(engine.store_dir) as local:
            def on_host(queue_id: int, offset: int) -> tuple[int, int]:
                reply = local.pull(topic, queue_id, offset, max_messages=1024)
                return len(reply.messages), reply.next_offset or offset

            record(f"{label} consume all on the same host (LocalReads.pull)", [consume_all(on_host, total)], "msg/s")
        record(f"{label} consume all (rmqpy.PullConsumer, typed)",
               [consume_iterating(engine, f"peers-{total}", topic, total)], "msg/s")
        record(f"{label} consume all on the same host (rmqpy.PullConsumer, store_dir)",
               [consume_iterating(engine, f"peers-local-{total}", topic, total, store_dir=engine.store_dir)], "msg/s")
        if meter:
            meter.stop()
        if total > 100_000:
            return
        single = [timed_ms(lambda i=i: client.send(f"{topic}-one", messages(i, 1), queue_id=0))
                  for i in range(SINGLES)]
        record(f"engine {flush_mode} single send p50", [percentile(single, 0.5)], "ms")
        record(f"engine {flush_mode} single send p99", [percentile(single, 0.99)], "ms")
        if flush_mode == "ASYNC_FLUSH":
            rng = random.Random(3)
            t0 = time.perf_counter()
            for _ in range(LOOKUPS):
                found = client.query_by_key(topic, f"key-{rng.randrange(total)}", max_results=8)
                assert len(found) == 1
            record("engine key lookups one at a time", [LOOKUPS / (time.perf_counter() - t0)], "lookups/s")
            t0 = time.perf_counter()
            for _ in range(LOOKUPS // 10):
                found_many = client.query_by_keys(topic, [f"key-{rng.randrange(total)}" for _ in range(100)],
                                                  max_results=8)
                assert all(len(found) == 1 for found in found_many)
            record("engine key lookups, 100 keys a request (query_by_keys)",
                   [LOOKUPS * 10 / (time.perf_counter() - t0)], "lookups/s")
            with LocalReads(engine.store_dir) as local:
                t0 = time.perf_counter()
                for _ in range(LOOKUPS * 10):
                    found = local.query_by_key(topic, f"key-{rng.randrange(total)}", max_results=8)
                    assert len(found) == 1
                record("engine key lookups one at a time on the same host (LocalReads)",
                       [LOOKUPS * 10 / (time.perf_counter() - t0)], "lookups/s")


def hops(engine: EngineProcess, flush_mode: str) -> None:
    """One request at a time, each kind 2,000 times (the first 500 warm up): what each hop adds.

    ping: client -> front -> client. get_by_offset: the same, through an owner. send: through
    the writer (and under SYNC_FLUSH the flusher's fdatasync and its wake-up of the writer)."""
    with engine.client() as client:
        client.create_topic("hops", queue_count=1)
        sent = client.send("hops", messages(0, 1), queue_id=0)[0]
        kinds: dict[str, Callable[[], Any]] = {
            "ping (front)": client.ping,
            "get_by_offset (front + owner)": lambda: client.get_by_offset(sent["commit_log_offset"]),
            "send 1 message": lambda: client.send("hops", messages(0, 1), queue_id=0),
        }
        for kind, call in kinds.items():
            latencies = [timed_ms(call) for _ in range(2000)][500:]
            record(f"engine {flush_mode} one at a time: {kind} p50", [percentile(latencies, 0.5)], "ms")


def kills(engine: EngineProcess) -> None:
    """SIGKILL each actor kind ``KILLS`` times: ms until a request it serves succeeds again."""
    with engine.client() as client:
        client.create_topic("kills", queue_count=2)
        sent = client.send("kills", messages(0, 10), queue_id=0)
    probes: dict[str, Callable[[StoreClient], Any]] = {
        "writer": lambda c: c.send("kills", messages(0, 1), queue_id=0),
        "flusher": lambda c: c.send("kills", messages(0, 1), queue_id=1),
        "owner-0": lambda c: [c.pull("kills", q, 0) for q in range(2)],
        "owner-1": lambda c: [c.pull("kills", q, 0) for q in range(2)],
        "index": lambda c: c.query_by_key("kills", "key-3"),
        "reput": lambda c: c.get_by_id(sent[0]["msg_id"]),
        "front": lambda c: c.ping(),
        "timer": lambda c: c.ping(),
        "transactions": lambda c: c.ping(),
    }
    for name, probe in probes.items():
        times = []
        for _ in range(KILLS):
            events = EventStream(engine.store_dir)
            with engine.client(timeout_ms=2000) as client:
                pid = actor_pids(engine.store_dir)[name]
                t0 = time.perf_counter()
                os.kill(pid, 9)
                events.wait_for("actor.exited", name=name)
                events.wait_for("actor.running", name=name)
                while True:
                    try:
                        if probe(client):
                            break
                    except ClientError:
                        continue
                times.append((time.perf_counter() - t0) * 1000)
            events.close()
        record(f"engine SIGKILL {name} -> serving again (worst of {KILLS})", [max(times)], "ms")


def run(workdir: Path, *, million: bool) -> None:
    """Everything, in one run. The kills run on an engine of their own whose restarts are all
    immediate (``restart_window_ms`` of 1 ms: each is the first of its window), so what is timed is
    the restart itself, not the back-off that protects against crash loops."""
    ref_fdatasync(workdir)
    ref_zmq_round_trip()
    totals = [100_000, 1_000_000] if million else [100_000]
    for total in totals:
        sqlite_peer(workdir, total)
        redis_peer(workdir, total)
    for flush_mode in ("SYNC_FLUSH", "ASYNC_FLUSH"):
        with EngineProcess(workdir / f"peers-{flush_mode}", config=engine_config(flush_mode),
                           start_timeout_s=120) as engine:
            hops(engine, flush_mode)
            cpu_per_message(engine, flush_mode, totals[0])
            meter = CpuMeter(engine)
            for total in totals:
                engine_peer(engine, flush_mode, total, meter)
            spent = sum(meter.spent.values())
            for name, seconds in sorted(meter.spent.items(), key=lambda kv: -kv[1]):
                record(f"engine {flush_mode} CPU share {name}", [100 * seconds / spent], "%")
    kill_config = engine_config("ASYNC_FLUSH").replace(restart_window_ms=1, restart_count_max=1_000)
    with EngineProcess(workdir / "peers-kills", config=kill_config, start_timeout_s=120) as engine:
        kills(engine)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--million", action="store_true", help="also 1,000,000 messages")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--set", type=setting, action="append", default=[], metavar="NAME=VALUE",
                        help="change a setting of the engine for this run (e.g. index_uniq_key_enabled=false)")
    args = parser.parse_args()
    SETTINGS.update(args.set)
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as workdir:
        run(Path(workdir), million=args.million)
    if args.json:
        import json

        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "results": RESULTS}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
