"""What a store takes on disk: blocks allocated (``du``), not the files' logical sizes.

    .venv/bin/python scripts/bench_footprint.py [--profile default|dev] [--store-dir DIR]

A fresh store with RocketMQ's default sizes (1 GiB segments, 6,000,000-byte ConsumeQueue
files, 5 M index slots; or ``profile = "dev"``), started and then, cleanly stopped at each
step, measured per directory: empty; after one message; after 4 MiB of 256-byte messages on
one queue; after one message to each of 20 more topics of one queue (auto-created).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import StoreConfig
from supervisor.launcher import EngineProcess, write_config

MiB = 1 << 20


def allocated_bytes(path: Path) -> int:
    """The blocks a tree holds (st_blocks: what ``du`` counts), not its files' sizes."""
    if not path.exists():
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def report(step: str, store: Path) -> None:
    parts = {name: allocated_bytes(store / name) for name in ("commitlog", "consumequeue", "index", "timerlog",
                                                               "timerwheel", "config")}
    whole = allocated_bytes(store)
    detail = " ".join(f"{name}={size / MiB:.1f}" for name, size in parts.items() if size)
    print(f"{step:<44} {whole / MiB:9.1f} MiB   ({detail})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=("default", "dev"), default="default")
    parser.add_argument("--store-dir", type=Path, help="where to make the store (default: a temporary directory)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="rmq-footprint-", dir=args.store_dir))
    store = scratch / "store"
    settings = {"profile": "dev"} if args.profile == "dev" else {}
    config = StoreConfig.load(None, metrics_endpoint="", **settings)
    config_file = write_config(scratch / "engine.toml", config)
    steps = [("empty store", []), ("one message", [(["one"], 1, 64)]),
             ("4 MiB of 256-byte messages on one queue", [(["bulk"], 16_384, 256)]),
             ("one message to each of 20 more topics", [([f"t{i}" for i in range(20)], 1, 64)])]
    try:
        print(f"profile {args.profile}: segment {config.segment_size_bytes // MiB} MiB, "
              f"ConsumeQueue file {config.consume_queue_file_bytes} bytes, "
              f"{config.index_hash_slot_count} index slots", flush=True)
        for step, sends in steps:
            engine = EngineProcess(store, config=StoreConfig.load(config_file, metrics_endpoint=""))
            engine.start()
            try:
                with engine.client() as client:
                    for topics, count, body_bytes in sends:
                        for topic in topics:
                            client.create_topic(topic, queue_count=1)
                            for first in range(0, count, 1_000):
                                batch = [{"body": b"x" * body_bytes}] * min(1_000, count - first)
                                client.send(topic, batch, queue_id=0)
            finally:
                engine.stop()
            report(step, store)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
