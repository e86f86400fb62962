"""Per-topic and per-queue statistics of a store with Spark: messages, offsets, bytes, store times.

    python scripts/spark_stats.py --store-dir store
    python scripts/spark_stats.py --store-dir store --topics orders --json

Reads the CommitLog without bodies (``rmq_store`` with ``includeBody=false``).
``missing_offsets`` counts queue offsets between the first and last message
of a queue that the log does not hold (damaged records, or a store whose
older segments were removed in the middle of a queue). Runs with ``local[*]``
unless ``--master`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.progress import SparkJobBar
from engine.spark.jobs import queue_statistics, topic_statistics
from engine.spark.session import build_session, stop_session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--topics", help="comma-separated topics (default: all)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="1g")
    args = parser.parse_args(argv)
    spark = build_session(master=args.master, app_name="rmq-stats", driver_memory=args.driver_memory)
    try:
        queues = queue_statistics(spark, args.store_dir, topics=args.topics.split(",") if args.topics else None)
        queues.cache()
        with SparkJobBar(spark.sparkContext, desc="stats", enabled=False if args.json else None):
            topic_rows = [r.asDict() for r in topic_statistics(queues).collect()]
            queue_rows = [r.asDict() for r in queues.collect()]
    finally:
        stop_session(spark)
    if args.json:
        print(json.dumps({"topics": topic_rows, "queues": queue_rows}, indent=2, default=str))
        return 0
    print(f"{'topic':<24} {'queues':>6} {'messages':>12} {'stored bytes':>14}  first stored .. last stored")
    for r in topic_rows:
        print(f"{r['topic']:<24} {r['queues']:>6} {r['messages']:>12} {r['stored_bytes']:>14}  "
              f"{r['first_stored']} .. {r['last_stored']}")
    print()
    print(f"{'topic':<24} {'queue':>5} {'messages':>10} {'offsets':>17} {'missing':>7} {'stored bytes':>14}")
    for r in queue_rows:
        print(f"{r['topic']:<24} {r['queue_id']:>5} {r['messages']:>10} "
              f"{r['min_offset']:>8}..{r['max_offset']:<8} {r['missing_offsets']:>7} {r['stored_bytes']:>14}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
