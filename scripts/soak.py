"""A bounded soak: steady load with periodic kills, sampling every actor's memory and files.

    python scripts/soak.py --duration-s 600 --kill-interval-s 30
    python scripts/soak.py --duration-s 120 --flush-mode SYNC_FLUSH --json soak.json

Every ``--sample-interval-s`` it records each actor's private memory (RSS
less shared file pages: the mapped log is page cache, not a leak) and open
file descriptors (psutil); every ``--kill-interval-s`` it SIGKILLs a random actor.
At the end it reads every queue back and checks every acknowledged message,
runs ``check``, and compares each actor's memory and descriptors in the last
fifth of the run with the first fifth after warm-up. Exit code 1 on lost or
corrupt data, on findings, or on growth beyond ``--rss-growth-max-mib`` /
``--fds-growth-max``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.check import check_store  # noqa: E402
from engine.config import StoreConfig  # noqa: E402
from supervisor.faults import kill_actor  # noqa: E402
from supervisor.launcher import EngineProcess  # noqa: E402
from supervisor.workload import Producer, ProducerThread, read_everything, verify, wait_dispatched  # noqa: E402

TOPICS = {"soak-a": 4, "soak-b": 4}


def sample(engine: EngineProcess, samples: dict[str, list[tuple[float, int, int]]], started: float) -> None:
    for name, pid in engine.actor_pids().items():
        try:
            process = psutil.Process(pid)
            memory = process.memory_info()
            # Private memory: RSS less the shared file pages (the mapped log and queues are page cache).
            samples[name].append((time.monotonic() - started, memory.rss - memory.shared, process.num_fds()))
        except psutil.Error:
            continue


def growth(series: list[tuple[float, int, int]]) -> tuple[float, int]:
    """(RSS growth in MiB, fd growth) between the second fifth and the last fifth of a series."""
    if len(series) < 10:
        return 0.0, 0
    fifth = len(series) // 5
    early, late = series[fifth:2 * fifth], series[-fifth:]
    rss = (statistics.median(s[1] for s in late) - statistics.median(s[1] for s in early)) / (1 << 20)
    fds = max(s[2] for s in late) - max(s[2] for s in early)
    return rss, fds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=120)
    parser.add_argument("--kill-interval-s", type=float, default=20)
    parser.add_argument("--sample-interval-s", type=float, default=1)
    parser.add_argument("--flush-mode", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rss-growth-max-mib", type=float, default=32)
    parser.add_argument("--fds-growth-max", type=int, default=8)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    print(f"seed={seed}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="soak-"))
    config = StoreConfig.test_min().replace(flush_mode=args.flush_mode, segment_size_bytes=64 << 20)
    engine = EngineProcess(base / "store", config=config)
    engine.start()
    samples: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    kills: list[str] = []
    try:
        producer = Producer("soak", engine.client(timeout_ms=3_000), TOPICS, random.Random(seed), batch_size=16)
        thread = ProducerThread(producer).start()
        started = time.monotonic()
        next_kill = started + args.kill_interval_s
        while time.monotonic() - started < args.duration_s:
            sample(engine, samples, started)
            if time.monotonic() >= next_kill:
                role = rng.choice(["writer", "flusher", "owner", "index", "reput", "front"])
                name, _pid = kill_actor(engine.store_dir, role, rng=rng)
                kills.append(name)
                next_kill += args.kill_interval_s
            time.sleep(args.sample_interval_s)  # the soak's own sampling period
        thread.stop()
        producer.client.close()
        with engine.client(timeout_ms=10_000) as client:
            wait_dispatched(client, timeout_ms=60_000)
            verdict = verify([producer], read_everything(client, TOPICS))
    finally:
        engine.stop()
    findings = check_store(engine.store_dir, engine.config)
    shutil.rmtree(base, ignore_errors=True)
    report = {"seed": seed, "duration_s": args.duration_s, "kills": kills, "verdict": verdict.summary(),
              "check_findings": [str(f) for f in findings], "actors": {}}
    grew = []
    for name, series in sorted(samples.items()):
        rss_growth, fd_growth = growth(series)
        report["actors"][name] = {"private_mib_last": round(series[-1][1] / (1 << 20), 1),
                                  "private_growth_mib": round(rss_growth, 1), "fds_last": series[-1][2],
                                  "fds_growth": fd_growth}
        if rss_growth > args.rss_growth_max_mib or fd_growth > args.fds_growth_max:
            grew.append(name)
    ok = verdict.ok() and not findings and not grew
    report["result"] = "PASS" if ok else "FAIL"
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
