"""Export a store's messages to Parquet with Spark, partitioned by topic (and optionally by store date).

    python scripts/spark_export.py --store-dir store --output export/
    python scripts/spark_export.py --store-dir store --output export/ --topics orders,payments --by-date
    python scripts/spark_export.py --store-dir store --output export/ --no-body --start-ms 1763800000000

Reads the CommitLog (``rmq_store``): a live engine's directory (up to its
confirmed offset), a stopped one, or a copy from a RocketMQ broker. Runs with
``local[*]`` unless ``--master`` says otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.spark.jobs import export_parquet
from engine.spark.session import build_session, stop_session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--output", required=True, help="a new directory for the Parquet files")
    parser.add_argument("--topics", help="comma-separated topics (default: all)")
    parser.add_argument("--no-body", action="store_true", help="leave the body column empty")
    parser.add_argument("--start-ms", type=int, help="only messages stored at or after this time (epoch ms)")
    parser.add_argument("--end-ms", type=int, help="only messages stored before this time (epoch ms)")
    parser.add_argument("--by-date", action="store_true", help="also partition by store date (UTC)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="1g")
    args = parser.parse_args(argv)
    spark = build_session(master=args.master, app_name="rmq-export", driver_memory=args.driver_memory)
    started = time.monotonic()
    try:
        rows = export_parquet(spark, args.store_dir, args.output,
                              topics=args.topics.split(",") if args.topics else None,
                              include_body=not args.no_body, start_ms=args.start_ms, end_ms=args.end_ms,
                              by_date=args.by_date)
    finally:
        stop_session(spark)
    print(f"exported {rows} messages to {args.output} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
