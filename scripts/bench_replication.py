"""Replication's cost and lag: a master alone, with ASYNC replicas, with SYNC ones, on loopback.

    python scripts/bench_replication.py              # 100,000 messages of 256 B a run, 2 replicas
    python scripts/bench_replication.py --reps 3 --replicas 1

For each setup (no replica, under ASYNC_FLUSH and SYNC_FLUSH; replicas with replication_mode
ASYNC; SYNC), in fresh engines on this machine (all on the same cores: the figures are an upper
bound of the cost on separate machines):

* produce batches of 1,000 one at a time and 4 in flight, msg/s;
* one send at a time, p50 and p99 (wait_store, as a durable producer sends);
* with replicas, how far the first is behind while the producer runs (bytes, sampled every 10 ms),
  the ASYNC loss window a crash of the master would open at that instant;
* an empty replica catching up a master's 100,000 messages: MB/s.

Each figure is printed as bench.py prints its own (median, min, max of the repetitions).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import body_of, percentile, pipelined, record, request_frame

from engine.config import StoreConfig
from harness.replication import offsets, replicated_set, wait_replicated
from supervisor.launcher import EngineProcess, free_port

BATCH, BODY, QUEUES = 1000, 256, 4
FIGURES: dict[str, tuple[list[float], str]] = {}  # name -> (one value a repetition, unit)


def note(name: str, value: float, unit: str) -> None:
    FIGURES.setdefault(name, ([], unit))[0].append(value)


def batches(total: int) -> list[list[dict[str, object]]]:
    return [[{"body": body_of(BODY, i), "keys": [f"key-{i}"], "tags": "tag"} for i in range(first, first + BATCH)]
            for first in range(0, total, BATCH)]


def wait_in_sync(master: EngineProcess, replicas: int) -> None:
    deadline = time.monotonic() + 30
    with master.client() as client:
        while offsets(client)["in_sync_replicas"] < replicas:
            if time.monotonic() > deadline:
                raise TimeoutError("the replica never came in sync")


def produce(master: EngineProcess, replica: EngineProcess | None, label: str, total: int) -> None:
    with master.client(timeout_ms=60_000) as client:
        client.create_topic("bench", queue_count=QUEUES)
        client.create_topic("bench-4", queue_count=QUEUES)
        lags: list[int] = []
        done = threading.Event()

        def sample() -> None:
            assert replica is not None
            with master.client() as mc, replica.client() as rc:
                while not done.wait(0.01):
                    lags.append(max(0, offsets(mc)["written_offset"] - offsets(rc)["written_offset"]))

        sampler = threading.Thread(target=sample, daemon=True) if replica else None
        if sampler:
            sampler.start()
        t0 = time.perf_counter()
        for batch in batches(total):
            client.send("bench", batch)
        note(f"{label} produce batch={BATCH}, 1 in flight", total / (time.perf_counter() - t0), "msg/s")
        done.set()
        if sampler:
            sampler.join()
            note(f"{label} replica behind while producing, p50", percentile(lags, 0.5) / 1024, "KiB")
            note(f"{label} replica behind while producing, p99", percentile(lags, 0.99) / 1024, "KiB")
        frames = [request_frame("send", n, topic="bench-4", messages=batch) for n, batch in enumerate(batches(total))]
        seconds, replies = pipelined(master.endpoint, frames, inflight=4)
        bad = [r for r in replies if not r["ok"]]
        assert not bad, bad[:3]
        note(f"{label} produce batch={BATCH}, 4 in flight", total / seconds, "msg/s")
        latencies = []
        for i in range(2000):
            t0 = time.perf_counter()
            client.send("bench", [{"body": body_of(BODY, i)}])
            latencies.append((time.perf_counter() - t0) * 1000)
        note(f"{label} single send p50", percentile(latencies, 0.5), "ms")
        note(f"{label} single send p99", percentile(latencies, 0.99), "ms")


def catch_up(root: Path, config: StoreConfig, total: int) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with EngineProcess(root / "lead", config=config.replace(replication_endpoint=endpoint)) as master:
        with master.client(timeout_ms=60_000) as client:
            for batch in batches(total):
                client.send("bench", batch)
            end = offsets(client)["written_offset"]
        t0 = time.perf_counter()
        with EngineProcess(root / "follower", config=config.replace(replica_of=endpoint)) as replica:
            with master.client() as mc, replica.client() as rc:
                wait_replicated(mc, rc, timeout_s=300)
            seconds = time.perf_counter() - t0
        note("empty replica catching up (start, copy, dispatch)", end / seconds / 2**20, "MiB/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    base = StoreConfig.test_min().replace(segment_size_bytes=64 << 20, metrics_endpoint="")
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="bench-replication-") as tmp:
            root = Path(tmp)
            for flush_mode in ("ASYNC_FLUSH", "SYNC_FLUSH"):
                with EngineProcess(root / f"alone-{flush_mode}-{rep}", config=base.replace(flush_mode=flush_mode)) \
                        as alone:
                    produce(alone, None, f"no replica, {flush_mode}", args.total)
            for mode in ("ASYNC", "SYNC"):
                with replicated_set(root / f"{mode}-{rep}", base.replace(replication_mode=mode),
                                    replicas=args.replicas) as (master, replicas):
                    wait_in_sync(master, args.replicas)
                    produce(master, replicas[0], f"{mode}, {args.replicas} replicas", args.total)
            catch_up(root, base, args.total)
    for name, (values, unit) in FIGURES.items():
        record(name, values, unit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
