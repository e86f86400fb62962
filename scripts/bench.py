"""The benchmark suite: the engine side by side with the references, in one run.

    python scripts/bench.py                 # everything, 3 repetitions (about 5-10 minutes)
    python scripts/bench.py --quick         # fewer messages, 3 repetitions
    python scripts/bench.py --only send,pull --json bench.json
    python scripts/bench.py --only peers --million   # the peers' workload (scripts/bench_peers.py)

It starts real engines (``python -m supervisor start`` through
``supervisor.launcher``) and talks to them only through the public protocol
over ZeroMQ. Every message carries a key and a tag. Each figure is the median
of the repetitions, with min and max. References measured in the same run:

* raw append: 1 MiB writes to a fresh file, fdatasync after each (the disk);
* ZeroMQ echo: DEALER/ROUTER, the same frames echoed (the transport);
* SQLite in WAL mode, synchronous=FULL, an index on the key (what a Python
  user would embed instead), doing the same sends, reads and key lookups.

Results: a table on stdout, JSON with ``--json``; BENCHMARKS.md keeps them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import psutil
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import codec
from engine.config import MiB, StoreConfig
from engine.ipc.protocol import PROTOCOL_VERSION, SendMessage
from harness.faults import actor_pids
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

encode = msgspec.msgpack.encode
decode = msgspec.msgpack.decode
RESULTS: dict[str, dict[str, float]] = {}


def record(name: str, values: list[float], unit: str) -> None:
    RESULTS[name] = {"median": statistics.median(values), "min": min(values), "max": max(values), "unit": unit,
                     "runs": len(values)}
    r = RESULTS[name]
    digits = 3 if unit == "ms" else 1  # latencies of a tenth of a millisecond need the places
    print(f"{name:<58} {r['median']:>14,.{digits}f} {unit:<8} (min {r['min']:,.{digits}f}, max {r['max']:,.{digits}f})",
          flush=True)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def body_of(size: int, i: int) -> bytes:
    return (b"%08d" % i + b"x" * size)[:size]


def message(size: int, i: int) -> dict[str, Any]:
    return {"body": body_of(size, i), "keys": [f"key-{i}"], "tags": f"tag{i % 4}"}


# -- pipelined requests over one DEALER --------------------------------------------------------

def pipelined(endpoint: str, frames: list[bytes], *, inflight: int, timeout_s: float = 120) -> tuple[float, list]:
    """Send pre-encoded requests keeping ``inflight`` outstanding; (seconds, replies in order of arrival)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    replies = []
    sent = 0
    started = time.perf_counter()
    deadline = started + timeout_s
    try:
        while len(replies) < len(frames):
            while sent < len(frames) and sent - len(replies) < inflight:
                sock.send(frames[sent], copy=False)
                sent += 1
            if not sock.poll(int(max(1, (deadline - time.perf_counter()) * 1000))):
                raise TimeoutError(f"{len(replies)} of {len(frames)} replies")
            replies.append(decode(sock.recv()))
        return time.perf_counter() - started, replies
    finally:
        sock.close()


def request_frame(op: str, request_id: int, **fields: Any) -> bytes:
    return encode({"v": PROTOCOL_VERSION, "op": op, "id": request_id, **fields})


# -- engine measurements -------------------------------------------------------------------------

def bench_send(engine: EngineProcess, label: str, *, body: int, batch: int, total: int, reps: int,
               inflight: int) -> str:
    rates, topic = [], ""
    for rep in range(reps):
        topic = f"send-{label}-{body}-{batch}-{rep}"
        frames = [request_frame("send", n, topic=topic, messages=[message(body, n * batch + i) for i in range(batch)])
                  for n in range(total // batch)]
        seconds, replies = pipelined(engine.endpoint, frames, inflight=inflight)
        refused = [r.get("error") or r["results"][0]["status"] for r in replies
                   if not r["ok"] or r["results"][0]["status"] != "PUT_OK"]
        assert not refused, f"{len(refused)} of {len(replies)} sends not stored: {refused[:3]}"
        rates.append(len(frames) * batch / seconds)
    record(f"engine send {label} body={body}B batch={batch}", rates, "msg/s")
    return topic


def bench_batch_forms(engine: EngineProcess, flush_mode: str, *, total: int, reps: int) -> None:
    """One batch of 1,000 in flight, as message maps and as records the client encodes (timed with
    the encoding), alternated rep by rep, each rep starting with the dispatch caught up."""
    rates: dict[str, list[float]] = {"messages": [], "records": []}
    with engine.client(timeout_ms=60_000) as client:
        for rep in range(reps):
            for form, values in rates.items():
                topic = f"forms-{flush_mode}-{form}-{rep}"
                batches = [[message(256, first + i) for i in range(1000)] for first in range(0, total, 1000)]
                typed = [[SendMessage(**m) for m in batch] for batch in batches]
                wait_dispatched(client, timeout_ms=300_000)
                t0 = time.perf_counter()
                for n, batch in enumerate(batches):
                    if form == "messages":
                        client.request("send", topic=topic, messages=batch)
                    else:
                        client.request("send", topic=topic, records=codec.batch_records(typed[n], "BE", n * 1000)[0])
                values.append(total / (time.perf_counter() - t0))
    for form, values in rates.items():
        record(f"engine send {flush_mode} body=256B batch=1000, 1 in flight, as {form}", values, "msg/s")


def bench_pull(engine: EngineProcess, topic: str, *, reps: int) -> None:
    with engine.client() as client:
        wait_dispatched(client, timeout_ms=120_000)
        queues = {t["topic"]: t["queue_count"] for t in client.list_topics()}[topic]
    rates = []
    for _ in range(reps):
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(engine.endpoint)
        offsets = dict.fromkeys(range(queues), 0)
        count = 0
        started = time.perf_counter()
        for q in offsets:
            sock.send(request_frame("pull", q, topic=topic, queue_id=q, offset=0, max_messages=1024))
        open_queues = len(offsets)
        while open_queues:
            reply = decode(sock.recv())
            q = reply["id"]
            if reply["status"] != "FOUND":
                open_queues -= 1
                continue
            count += len(reply["messages"])
            sock.send(request_frame("pull", q, topic=topic, queue_id=q, offset=reply["next_offset"],
                                    max_messages=1024))
        rates.append(count / (time.perf_counter() - started))
        sock.close()
    record(f"engine pull whole topic ({count} msgs, {queues} queues)", rates, "msg/s")


def _load_topic(engine: EngineProcess, topic: str, total: int, *, body: int = 256, queues: int = 8) -> None:
    with engine.client() as client:
        client.create_topic(topic, queue_count=queues)
    frames = [request_frame("send", n, topic=topic, messages=[{"body": body_of(body, n * 1000 + i)}
                                                               for i in range(1000)])
              for n in range(total // 1000)]
    pipelined(engine.endpoint, frames, inflight=4)
    with engine.client() as client:
        wait_dispatched(client, timeout_ms=120_000)


def _consume_all(endpoint: str, total: int, first: Callable[[int], bytes],
                 after: Callable[[dict[str, Any]], tuple[list[bytes], int]], *, inflight: int) -> float:
    """Keep ``inflight`` requests out; each reply gives the next requests and how many messages it
    finished. Returns seconds until ``total`` messages are finished."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    done = 0
    started = time.perf_counter()
    try:
        for slot in range(inflight):
            sock.send(first(slot))
        while done < total:
            if not sock.poll(60_000):
                raise TimeoutError(f"{done} of {total} messages consumed")
            frames, finished = after(decode(sock.recv()))
            done += finished
            for frame in frames:
                sock.send(frame)
        return time.perf_counter() - started
    finally:
        sock.close()


class PopAckLoop:
    """Each pop's messages are acked (one request per queue among them); the last ack's reply
    sends the next pop, so the requests in flight stay as many as the loop started with."""

    def __init__(self, topic: str, group: str) -> None:
        self.topic, self.group = topic, group
        self.ids = itertools.count(1)
        self.not_last: set[int] = set()  # acks after whose reply no pop follows

    def first(self, _slot: int) -> bytes:
        return request_frame("pop", next(self.ids), group=self.group, topic=self.topic, max_messages=32,
                             invisible_ms=60_000, max_wait_ms=100)

    def after(self, reply: dict[str, Any]) -> tuple[list[bytes], int]:
        assert reply["ok"], reply
        if "acked" in reply:
            assert not reply["failed"], reply["failed"]
            if reply["id"] in self.not_last:
                self.not_last.discard(reply["id"])
                return [], reply["acked"]
            return [self.first(0)], reply["acked"]
        by_queue: dict[int, list[str]] = {}
        for message, handle in zip(reply["messages"], reply["receipt_handles"], strict=True):
            by_queue.setdefault(message["queue_id"], []).append(handle)
        if not by_queue:
            return [self.first(0)], 0
        acks = []
        for queue_id, handles in by_queue.items():
            request_id = next(self.ids)
            self.not_last.add(request_id)
            acks.append(request_frame("ack", request_id, group=self.group, topic=self.topic, queue_id=queue_id,
                                      receipt_handles=handles))
        self.not_last.discard(request_id)
        return acks, 0


class PullCommitLoop:
    """Pull 32 from a queue, commit the next offset, pull that queue again: one queue per slot."""

    def __init__(self, topic: str, group: str) -> None:
        self.topic, self.group = topic, group
        self.offsets = dict.fromkeys(range(8), 0)

    def frame(self, queue_id: int) -> bytes:
        return request_frame("pull", queue_id, topic=self.topic, queue_id=queue_id, offset=self.offsets[queue_id],
                             max_messages=32)

    def after(self, reply: dict[str, Any]) -> tuple[list[bytes], int]:
        assert reply["ok"], reply
        if "status" not in reply:  # a commit's reply: pull that queue again
            return [self.frame(reply["id"] - 1_000)], 0
        queue_id = reply["id"]
        self.offsets[queue_id] = reply["next_offset"]
        commit = request_frame("commit_offset", 1_000 + queue_id, group=self.group, topic=self.topic,
                               queue_id=queue_id, offset=reply["next_offset"])
        return [commit], len(reply["messages"])


def bench_pop_ack(engine: EngineProcess, flush_mode: str, *, total: int, reps: int, inflight: int = 16) -> None:
    """Pop 32 at a time and ack each batch (one ack request per queue in it), 256 B messages, over a
    topic of 8 queues (RocketMQ's default count), 16 pops in flight (a pool of workers); beside it,
    pull 32 at a time from each queue and commit the offset after each batch."""
    pop_rates, pull_rates = [], []
    for rep in range(reps):
        topic = f"pop-{flush_mode}-{rep}"
        _load_topic(engine, topic, total)
        pops = PopAckLoop(topic, f"workers-{rep}")
        seconds = _consume_all(engine.endpoint, total, pops.first, pops.after, inflight=inflight)
        pop_rates.append(total / seconds)
        if flush_mode != "ASYNC_FLUSH":
            continue
        pulls = PullCommitLoop(topic, f"pullers-{rep}")
        seconds = _consume_all(engine.endpoint, total, pulls.frame, pulls.after, inflight=8)
        pull_rates.append(total / seconds)
    record(f"engine pop+ack {flush_mode} batch=32 body=256B ({total} msgs)", pop_rates, "msg/s")
    if pull_rates:
        record(f"engine pull+commit batch=32 body=256B ({total} msgs)", pull_rates, "msg/s")


def bench_key_lookups(engine: EngineProcess, topic: str, keys: int, *, reps: int) -> None:
    rng = random.Random(1)
    rates, p50s, p99s = [], [], []
    for _ in range(reps):
        frames = [request_frame("query_by_key", n, topic=topic, key=f"key-{rng.randrange(keys)}", max_results=8)
                  for n in range(4000)]
        seconds, replies = pipelined(engine.endpoint, frames, inflight=8)
        assert all(r["ok"] and len(r["messages"]) == 1 for r in replies[:50]), replies[:1]
        rates.append(len(frames) / seconds)
        latencies = []
        with engine.client() as client:
            for _ in range(500):
                t0 = time.perf_counter()
                client.query_by_key(topic, f"key-{rng.randrange(keys)}")
                latencies.append((time.perf_counter() - t0) * 1000)
        p50s.append(percentile(latencies, 0.5))
        p99s.append(percentile(latencies, 0.99))
    record("engine key lookups (8 in flight)", rates, "lookups/s")
    record("engine key lookup latency p50 (one at a time)", p50s, "ms")
    record("engine key lookup latency p99 (one at a time)", p99s, "ms")


def bench_durable_send_latency(engine: EngineProcess, *, reps: int) -> None:
    p50s, p99s = [], []
    with engine.client() as client:
        for rep in range(reps):
            latencies = []
            for i in range(1000):
                t0 = time.perf_counter()
                result = client.send(f"durable-{rep}", [message(256, i)], queue_id=0)[0]
                latencies.append((time.perf_counter() - t0) * 1000)
                assert result["status"] == "PUT_OK"
            p50s.append(percentile(latencies, 0.5))
            p99s.append(percentile(latencies, 0.99))
    record("engine single SYNC_FLUSH send latency p50", p50s, "ms")
    record("engine single SYNC_FLUSH send latency p99", p99s, "ms")


def bench_end_to_end(engine: EngineProcess, rate: float, *, reps: int, count: int = 3000) -> None:
    """Send single messages at ``rate``; a long-polling consumer measures send -> delivered."""


    with engine.client() as client:
        wait_dispatched(client, timeout_ms=300_000)  # start from an idle engine, not a backlog
    p50s, p99s, p999s = [], [], []
    for rep in range(reps):
        topic = f"e2e-{int(rate)}-{rep}"
        with engine.client() as client:
            client.create_topic(topic, queue_count=1)
        latencies: list[float] = []
        done = threading.Event()

        def consume(topic: str = topic, latencies: list[float] = latencies, done: threading.Event = done) -> None:
            with engine.client(timeout_ms=30_000) as consumer:
                offset = 0
                while len(latencies) < count:
                    reply = consumer.pull(topic, 0, offset, max_messages=256, max_wait_ms=2000)
                    now = time.perf_counter_ns()
                    for m in reply["messages"]:
                        latencies.append((now - int(m["properties"]["sent_ns"])) / 1e6)
                    offset = reply["next_offset"]
            done.set()

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        interval = 1.0 / rate
        with engine.client() as producer:
            next_at = time.perf_counter()
            for i in range(count):
                next_at += interval
                pause = next_at - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)  # pacing the offered load
                producer.send(topic, [{"body": body_of(256, i), "keys": [f"e2e-{i}"], "tags": "e2e",
                                       "properties": {"sent_ns": str(time.perf_counter_ns())}}], queue_id=0)
        done.wait(60)
        p50s.append(percentile(latencies, 0.5))
        p99s.append(percentile(latencies, 0.99))
        p999s.append(percentile(latencies, 0.999))
    record(f"engine end-to-end p50 at {rate:,.0f} msg/s (long poll)", p50s, "ms")
    record(f"engine end-to-end p99 at {rate:,.0f} msg/s (long poll)", p99s, "ms")
    record(f"engine end-to-end p99.9 at {rate:,.0f} msg/s (long poll)", p999s, "ms")


def bench_restart(engine: EngineProcess, *, reps: int) -> None:
    """SIGKILL each actor kind and time until a request that needs it succeeds again (and the
    actor reports its recovery done). Lookups are answered by the front, so the index builder
    counts as serving again once a message sent after the kill is found by its key."""
    with engine.client() as client:
        client.create_topic("restart", queue_count=2)
        sent = client.send("restart", [message(256, i) for i in range(10)], queue_id=0)
    late = {"key": ""}  # a key first sent after the kill
    probes: dict[str, Callable[[Any], Any]] = {
        "writer": lambda c: c.send("restart", [message(256, 0)], queue_id=0),
        "owner-0": lambda c: [c.pull("restart", q, 0) for q in range(2)],
        "index": lambda c: (c.send("restart", [{"body": b"late", "keys": [late["key"]]}], queue_id=1)
                            and c.query_by_key("restart", late["key"])),
        "reput": lambda c: c.get_by_id(sent[0]["msg_id"]),
        "flusher": lambda c: c.send("restart", [message(256, 0)], queue_id=1),
        "front": lambda c: c.ping(),
    }
    from engine.client import ClientError
    from engine.ipc.control import EventStream

    for name, probe in probes.items():
        times = []
        for rep in range(reps):
            late["key"] = f"late-{rep}"
            events = EventStream(engine.store_dir)
            with engine.client(timeout_ms=2000) as client:
                pid = actor_pids(engine.store_dir)[name]
                t0 = time.perf_counter()
                os.kill(pid, 9)
                events.wait_for("actor.exited", name=name)
                while True:
                    try:
                        if probe(client):
                            break
                    except ClientError:
                        continue
                events.wait_for("recovery.done", name=name)
                times.append((time.perf_counter() - t0) * 1000)
            events.close()
        record(f"engine SIGKILL {name} -> serving again", times, "ms")


def actor_memory(engine: EngineProcess) -> None:
    for name, pid in sorted(engine.actor_pids().items()):
        memory = psutil.Process(pid).memory_info()
        RESULTS[f"memory {name}"] = {"median": (memory.rss - memory.shared) / MiB, "min": memory.rss / MiB,
                                     "max": memory.rss / MiB, "unit": "MiB private (rss in min/max)", "runs": 1}
        print(f"memory {name:<12} private {(memory.rss - memory.shared) / MiB:6.1f} MiB, "
              f"rss {memory.rss / MiB:6.1f} MiB")


# -- recovery scan -------------------------------------------------------------------------------

def bench_recovery_scan(workdir: Path, *, size_bytes: int, reps: int) -> None:
    from engine.layout import HostAddress, RecordFields, encode_properties
    from engine.services.recovery import plan_commit_log_recovery
    from engine.store.commit_log import CommitLogWriter

    store = workdir / "recovery-store"
    config = StoreConfig().replace(segment_size_bytes=256 * MiB)
    writer = CommitLogWriter(store, config.segment_size_bytes, store_host=HostAddress.parse("127.0.0.1", 10911),
                             with_record_crc=True)
    host = HostAddress.parse("127.0.0.1", 1)
    i = 0
    while writer.written_offset < size_bytes:
        batch = [RecordFields(b"recover", i % 8, body_of(4096, i + k), encode_properties(
            {"KEYS": f"k{i + k}", "TAGS": "t", "UNIQ_KEY": f"{i + k:032X}"}), 0, 1, host) for k in range(256)]
        writer.append(batch, first_queue_offset=i, store_timestamp_ms=1)
        i += 256
    end = writer.written_offset
    writer.close()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        plan = plan_commit_log_recovery(store, config)  # no checkpoint: a crash start scans everything
        rates.append(end / MiB / (time.perf_counter() - t0))
        assert plan.end_offset == end
    record(f"engine recovery scan, crash start ({end / MiB:,.0f} MiB log, CRCs checked)", rates, "MiB/s")
    shutil.rmtree(store)


# -- references ----------------------------------------------------------------------------------

def ref_raw_append(workdir: Path, *, reps: int, size_bytes: int = 256 * MiB) -> None:
    chunk = os.urandom(MiB)
    rates = []
    for rep in range(reps):
        path = workdir / f"raw-{rep}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        t0 = time.perf_counter()
        for _ in range(size_bytes // MiB):
            os.write(fd, chunk)
            os.fdatasync(fd)
        rates.append(size_bytes / MiB / (time.perf_counter() - t0))
        os.close(fd)
        path.unlink()
    record("reference raw append, fdatasync every 1 MiB", rates, "MiB/s")


def ref_zmq_echo(*, body: int, batch: int, total: int, reps: int, inflight: int) -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            if router.poll(100):
                router.send_multipart(router.recv_multipart(copy=False), copy=False)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    rates = []
    frame = request_frame("send", 1, topic="t", messages=[message(body, i) for i in range(batch)])
    for _ in range(reps):
        seconds, _ = pipelined(f"tcp://127.0.0.1:{port}", [frame] * (total // batch), inflight=inflight)
        rates.append(total / seconds)
    stop.set()
    thread.join()
    router.close()
    record(f"reference zmq DEALER/ROUTER echo body={body}B batch={batch}", rates, "msg/s")


def ref_sqlite(workdir: Path, *, body: int, batch: int, total: int, reps: int) -> None:
    send_rates, read_rates, lookup_rates = [], [], []
    rng = random.Random(2)
    for rep in range(reps):
        path = workdir / f"sqlite-{rep}.db"
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, topic TEXT, queue INTEGER, key TEXT, tags TEXT, "
                   "born INTEGER, body BLOB)")
        db.execute("CREATE INDEX m_key ON m (topic, key)")
        t0 = time.perf_counter()
        for n in range(total // batch):
            rows = [("t", n % 4, f"key-{n * batch + i}", "tag", 0, body_of(body, n * batch + i)) for i in range(batch)]
            db.execute("BEGIN")
            db.executemany("INSERT INTO m (topic, queue, key, tags, born, body) VALUES (?, ?, ?, ?, ?, ?)", rows)
            db.execute("COMMIT")
        send_rates.append(total / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        count = sum(1 for _ in db.execute("SELECT * FROM m ORDER BY queue, id"))
        read_rates.append(count / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for _ in range(4000):
            db.execute("SELECT * FROM m WHERE topic = ? AND key = ?", ("t", f"key-{rng.randrange(total)}")).fetchall()
        lookup_rates.append(4000 / (time.perf_counter() - t0))
        db.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    record(f"reference SQLite WAL FULL insert body={body}B batch={batch}", send_rates, "msg/s")
    # named with the row count: the runs of one body size but fewer rows must not overwrite these
    record(f"reference SQLite read all body={body}B rows={total}", read_rates, "msg/s")
    record(f"reference SQLite key lookups (indexed) rows={total}", lookup_rates, "lookups/s")


# -- main ----------------------------------------------------------------------------------------

SETTINGS: dict[str, object] = {}  # --set name=value: the engine's settings changed for this run


def engine_config(flush_mode: str) -> StoreConfig:
    return StoreConfig().replace(flush_mode=flush_mode, segment_size_bytes=256 * MiB, send_batch_bytes_max=8 * MiB,
                                 client_frame_bytes_max=9 * MiB, warm_segments=flush_mode == "SYNC_FLUSH",
                                 heartbeat_timeout_ms=30_000, **SETTINGS)


def setting(text: str) -> tuple[str, object]:
    """``name=value``, the value read as JSON (true, 12) or else taken as a string."""
    name, _, value = text.partition("=")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer messages per figure")
    parser.add_argument("--only", default="",
                        help="comma list: refs,send,pull,lookup,latency,e2e,restart,recovery,pop,peers "
                             "(peers runs only when named)")
    parser.add_argument("--million", action="store_true", help="peers: also 1,000,000 messages")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--workdir", type=Path, help="where stores go (default: a temporary directory)")
    parser.add_argument("--set", type=setting, action="append", default=[], metavar="NAME=VALUE",
                        help="change a setting of the engine for this run (e.g. index_uniq_key_enabled=false)")
    args = parser.parse_args()
    SETTINGS.update(args.set)
    only = set(filter(None, args.only.split(",")))

    peers = "peers" in only  # the peers' workload is a run of its own (scripts/bench_peers.py)
    only.discard("peers")

    def want(part: str) -> bool:
        return (not only and not peers) or part in only

    scale = 0.25 if args.quick else 1.0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    reps = args.reps
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}")
    grid = [(256, 1, int(5_000 * scale)), (256, 32, int(64_000 * scale)), (256, 1000, int(300_000 * scale)),
            (4096, 1, int(3_000 * scale)), (4096, 32, int(32_000 * scale)), (4096, 1000, int(60_000 * scale))]
    try:
        if peers:
            import bench_peers  # it imports this file as the module ``bench``: its figures land there

            bench_peers.run(workdir, million=args.million)
            RESULTS.update(bench_peers.RESULTS)
        if want("refs"):
            ref_raw_append(workdir, reps=reps)
            for body, batch, total in grid:
                ref_zmq_echo(body=body, batch=batch, total=total, reps=reps, inflight=4)
            ref_sqlite(workdir, body=256, batch=1000, total=int(300_000 * scale), reps=reps)
            ref_sqlite(workdir, body=4096, batch=1000, total=int(60_000 * scale), reps=reps)
            ref_sqlite(workdir, body=256, batch=1, total=int(2_000 * scale), reps=reps)
        for flush_mode in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            if not (want("send") or want("pull") or want("lookup") or want("latency") or want("e2e")
                    or want("restart") or want("pop") or want("records")):
                break
            store = workdir / f"store-{flush_mode}"
            with EngineProcess(store, config=engine_config(flush_mode), start_timeout_s=120) as engine:
                topic = ""
                if want("send") or want("pull") or want("lookup"):
                    for body, batch, total in grid:
                        t = bench_send(engine, flush_mode, body=body, batch=batch, total=total, reps=reps,
                                       inflight=4)
                        if body == 256 and batch == 1000:
                            topic = t
                if want("records"):
                    bench_batch_forms(engine, flush_mode, total=int(100_000 * scale), reps=reps)
                if flush_mode == "ASYNC_FLUSH" and topic and want("pull"):
                    bench_pull(engine, topic, reps=reps)
                if flush_mode == "ASYNC_FLUSH" and topic and want("lookup"):
                    bench_key_lookups(engine, topic, int(300_000 * scale), reps=reps)
                if flush_mode == "SYNC_FLUSH" and want("latency"):
                    bench_durable_send_latency(engine, reps=reps)
                if flush_mode == "ASYNC_FLUSH" and want("e2e"):
                    single = RESULTS.get("engine send ASYNC_FLUSH body=256B batch=1", {}).get("median", 2000)
                    bench_end_to_end(engine, single / 2, reps=reps)  # the "half of the maximum"
                    bench_end_to_end(engine, 1000, reps=reps)  # well inside the single-message capacity
                if want("pop"):
                    bench_pop_ack(engine, flush_mode, total=int(200_000 * scale), reps=reps)
                if flush_mode == "ASYNC_FLUSH" and want("restart"):
                    bench_restart(engine, reps=reps)
                actor_memory(engine) if flush_mode == "ASYNC_FLUSH" else None
        if want("recovery"):
            bench_recovery_scan(workdir, size_bytes=int(1024 * MiB * scale), reps=reps)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                                         "cpus": os.cpu_count(), "results": RESULTS}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
