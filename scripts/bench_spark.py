"""Batch scan rate of the ``rmq_store`` Spark source, against the engine's own single-process reader.

    python scripts/bench_spark.py                          # 200,000 x 1 KiB messages, local[*], 3 runs
    python scripts/bench_spark.py --messages 50000 --runs 5 --json bench-results/spark.json
    python scripts/bench_spark.py --store-dir store --master local[4]   # an existing store

Unless ``--store-dir`` is given, a real engine (``supervisor.launcher``)
first fills a temporary store with ``--messages`` messages of
``--body-bytes`` random bytes, with a key and a tag each, over 4 queues, in
``--segment-mib`` segments (the scan has one partition per segment).

Measured, each ``--runs`` times after one warm-up run:

* ``engine reader``: ``CommitLogReader.scan(check_crc=True)`` over the whole
  log in this process, counting messages and stored bytes (what
  ``python -m engine check`` and recovery do);
* ``spark, bodies``: ``spark.read.format("rmq_store")`` with every column,
  aggregated (count, sum of stored sizes, sum of body lengths) so that every
  body reaches the JVM;
* ``spark, no bodies``: the same with ``includeBody=false``;
* ``spark, no bodies, no CRC``: and ``verifyCrc=false``.

Rates are messages/s and MB/s of CommitLog bytes (stored record sizes,
10^6 bytes per MB); each line shows the median and the min..max of the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import KiB, MiB, StoreConfig
from engine.offline.inspect_store import detect_config
from engine.store.commit_log import CommitLogReader, Damage
from supervisor.launcher import EngineProcess

Measure = Callable[[], tuple[int, int]]  # -> (messages, stored bytes)


def fill_store(store_dir: Path, *, messages: int, body_bytes: int, segment_mib: int) -> None:
    config = StoreConfig().replace(segment_size_bytes=segment_mib * MiB, consume_queue_file_units=300_000,
                                   index_hash_slot_count=500_000, index_item_count_max=2_000_000)
    rng = random.Random(1)
    batch = max(1, min(200, (512 * KiB) // max(body_bytes, 1)))
    with EngineProcess(store_dir, config=config) as engine, engine.client(timeout_ms=60_000) as client:
        client.create_topic("bench", queue_count=4)
        for start in range(0, messages, batch):
            count = min(batch, messages - start)
            client.send("bench", [{"body": rng.randbytes(body_bytes), "keys": [f"k{start + i}"], "tags": "t"}
                                  for i in range(count)], queue_id=(start // batch) % 4)


def engine_reader(store_dir: Path) -> Measure:
    def run() -> tuple[int, int]:
        config = detect_config(store_dir, StoreConfig())
        reader = CommitLogReader.for_config(store_dir, config)
        first, last = reader.segments.first_offset(), reader.segments.last_offset()
        count = stored = 0
        try:
            for item in reader.scan(first or 0, (last or 0) + config.segment_size_bytes, check_crc=True):
                if not isinstance(item, Damage):
                    count += 1
                    stored += item.total_size
        finally:
            reader.segments.close()
        return count, stored
    return run


def spark_scan(spark, store_dir: Path, **options: str) -> Measure:  # spark: a SparkSession
    from pyspark.sql import functions as F

    def run() -> tuple[int, int]:
        reader = spark.read.format("rmq_store")
        for name, value in options.items():
            reader = reader.option(name, value)
        row = reader.load(str(store_dir)).agg(F.count("*").alias("n"), F.sum("store_size").alias("stored"),
                                              F.sum(F.length("body")).alias("body")).first()
        return row["n"], row["stored"]
    return run


def measure(name: str, run: Measure, runs: int, results: dict[str, dict[str, float]]) -> None:
    expected = run()  # warm-up (and the reference counts)
    rates, mbs = [], []
    for _ in range(runs):
        started = time.perf_counter()
        got = run()
        elapsed = time.perf_counter() - started
        assert got == expected, (name, got, expected)
        rates.append(got[0] / elapsed)
        mbs.append(got[1] / elapsed / 1e6)
    results[name] = {"messages": expected[0], "stored_bytes": expected[1], "runs": runs,
                     "msgs_per_s_median": statistics.median(rates), "msgs_per_s_min": min(rates),
                     "msgs_per_s_max": max(rates), "mb_per_s_median": statistics.median(mbs),
                     "mb_per_s_min": min(mbs), "mb_per_s_max": max(mbs)}
    r = results[name]
    print(f"{name:<28} {r['msgs_per_s_median']:>12,.0f} msg/s ({r['msgs_per_s_min']:,.0f}..{r['msgs_per_s_max']:,.0f})"
          f" {r['mb_per_s_median']:>8,.1f} MB/s ({r['mb_per_s_min']:,.1f}..{r['mb_per_s_max']:,.1f})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-dir", type=Path, help="scan this store instead of filling a new one")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--segment-mib", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as scratch:
        store_dir = args.store_dir
        if store_dir is None:
            store_dir = Path(scratch) / "store"
            started = time.perf_counter()
            fill_store(store_dir, messages=args.messages, body_bytes=args.body_bytes, segment_mib=args.segment_mib)
            print(f"filled {store_dir} with {args.messages} x {args.body_bytes} B in "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
        results = run_all(store_dir, args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"results": results, "environment": environment(args)}, indent=2))
    return 0


def run_all(store_dir: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from engine.spark.session import build_session, stop_session

    segments = len(list((store_dir / "commitlog").iterdir()))
    print(f"store {store_dir}: {segments} segments; master {args.master}; {os.cpu_count()} cores", flush=True)
    results: dict[str, dict[str, float]] = {}
    measure("engine reader (1 process)", engine_reader(store_dir), args.runs, results)
    spark = build_session(master=args.master, app_name="rmq-bench", driver_memory="2g")
    try:
        measure("spark, bodies", spark_scan(spark, store_dir), args.runs, results)
        measure("spark, no bodies", spark_scan(spark, store_dir, includeBody="false"), args.runs, results)
        measure("spark, no bodies, no CRC", spark_scan(spark, store_dir, includeBody="false", verifyCrc="false"),
                args.runs, results)
    finally:
        stop_session(spark)
    return results


def environment(args: argparse.Namespace) -> dict[str, object]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip()
    except OSError:
        commit = ""
    return {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "python": platform.python_version(),
            "master": args.master, "messages": args.messages, "body_bytes": args.body_bytes,
            "segment_mib": args.segment_mib, "commit": commit}


if __name__ == "__main__":
    raise SystemExit(main())
