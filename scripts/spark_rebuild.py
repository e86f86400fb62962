"""Rebuild a store's ConsumeQueues and IndexFiles from its CommitLog with Spark, and verify the store.

    python scripts/spark_rebuild.py --store-dir store --output rebuilt          # rebuild + verify
    python scripts/spark_rebuild.py --store-dir store --output rebuilt --install
    python scripts/spark_rebuild.py --store-dir /shared/store --output /shared/rebuilt --master spark://host:7077

The findings are what ``python -m engine check`` reports for the store; the
differences list rebuilt files that do not equal the store's. ``--install``
swaps the rebuilt files in (the old ones are kept in ``broken-<time>/``),
as ``python -m engine check --repair`` does. The store must not be in use
by an engine. Runs with ``local[*]`` unless ``--master`` says otherwise; on a
cluster, the store and the output must be on a file system every executor
sees. Exit status: 0 clean, 1 findings or differences.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import StoreConfig
from engine.spark.rebuild import install_rebuilt, rebuild_store
from engine.spark.session import build_session, stop_session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-dir", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path, help="a new directory for the rebuilt files")
    parser.add_argument("--config", type=Path, help="the engine's TOML config (index sizes, queue file size)")
    parser.add_argument("--install", action="store_true", help="swap the rebuilt files into the store")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = StoreConfig.load(args.config)
    spark = build_session(master=args.master, app_name="rmq-rebuild", driver_memory=args.driver_memory)
    try:
        report = rebuild_store(spark, args.store_dir, args.output, config=config)
    finally:
        stop_session(spark)
    evidence = install_rebuilt(args.store_dir, report) if args.install else None
    if args.json:
        print(json.dumps({**asdict(report), "findings": [str(f) for f in report.findings],
                          "installed": evidence is not None}, indent=2))
    else:
        print(render(report))
        if evidence is not None:
            print(f"installed; the previous files are in {evidence}")
    return 0 if report.clean else 1


def render(report) -> str:  # report: a RebuildReport
    lines = [f"{report.records} records, {report.damaged_ranges} damaged ranges, log end {report.log_end}",
             f"{report.queues} queues and {report.index_files} index files ({report.index_items} items) "
             f"rebuilt in {report.output_dir}",
             f"findings ({len(report.findings)}):"]
    lines += [f"  {f}" for f in report.findings]
    differences = len(report.queue_differences) + len(report.index_differences)
    lines.append(f"differences from the store's files ({differences}):")
    lines += [f"  consumequeue {d}" for d in report.queue_differences]
    lines += [f"  index {d}" for d in report.index_differences]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
