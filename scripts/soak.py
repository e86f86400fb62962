"""A bounded soak: steady load with periodic kills, sampling every actor's memory and files.

    python scripts/soak.py --duration-s 600 --kill-interval-s 30
    python scripts/soak.py --duration-s 120 --flush-mode SYNC_FLUSH --json soak.json
    python scripts/soak.py --duration-s 28800 --kill-interval-s 600 --rate-msgs-per-s 2000 --sample-interval-s 10

Every ``--sample-interval-s`` it records each actor's private memory (RSS
less shared file pages: the mapped log is page cache, not a leak) and open
file descriptors (psutil); every ``--kill-interval-s`` it SIGKILLs a random actor.
At the end it reads every queue back and checks every acknowledged message,
runs ``check`` (in its own process, whose peak memory is reported apart), and
compares each actor's memory and descriptors in the last fifth of the run
with the first fifth after warm-up. For long runs it also reports each actor's
growth per hour (``private_mib_per_hour``, ``fds_per_hour``): the slope of a
least-squares line through each process lifetime of at least
``--slope-window-min-s`` (an actor restarted by a kill starts a new one; the
supervisor, never killed, has one), the median over lifetimes. Exit code 1 on lost or
corrupt data, on findings, or on growth beyond ``--rss-growth-max-mib`` /
``--fds-growth-max``, or if the script itself peaked above ``--self-rss-max-mib``.

The acknowledgements go to a file (``workload.AckLog``) and the check streams
(``workload.verify_streaming``), so the script's memory does not grow with the
run. The engine is stopped whatever happens: a ``finally`` (SIGTERM is handled
like Ctrl-C), and if the script is SIGKILLed, the supervisor's parent-death
signal (``EngineProcess`` starts it with ``--die-with-parent``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import StoreConfig
from harness.faults import kill_actor
from harness.workload import AckLog, Producer, ProducerThread, Verdict, verify_streaming, wait_dispatched
from supervisor.launcher import EngineProcess

TOPICS = {"soak-a": 4, "soak-b": 4}


Sample = tuple[float, int, int, int]  # seconds since the start, private bytes, open fds, pid


def sample(engine: EngineProcess, samples: dict[str, list[Sample]], started: float) -> None:
    for name, pid in {**engine.actor_pids(), "supervisor": engine.pid}.items():
        try:
            process = psutil.Process(pid)
            memory = process.memory_info()
            # Private memory: RSS less the shared file pages (the mapped log and queues are page cache).
            samples[name].append((time.monotonic() - started, memory.rss - memory.shared, process.num_fds(), pid))
        except psutil.Error:
            continue


def per_hour(series: list[Sample], window_min_s: float) -> tuple[float | None, float | None]:
    """(private MiB per hour, fds per hour): the median slope over the process lifetimes long enough."""
    lifetimes: dict[int, list[Sample]] = defaultdict(list)
    for s in series:
        lifetimes[s[3]].append(s)
    rss_slopes, fd_slopes = [], []
    for points in lifetimes.values():
        if len(points) < 3 or points[-1][0] - points[0][0] < window_min_s:
            continue
        times = [p[0] / 3600 for p in points]
        rss_slopes.append(statistics.linear_regression(times, [p[1] / (1 << 20) for p in points]).slope)
        fd_slopes.append(statistics.linear_regression(times, [float(p[2]) for p in points]).slope)
    if not rss_slopes:
        return None, None
    return statistics.median(rss_slopes), statistics.median(fd_slopes)


def growth(series: list[Sample]) -> tuple[float, int]:
    """(RSS growth in MiB, fd growth) between the second fifth and the last fifth of a series."""
    if len(series) < 10:
        return 0.0, 0
    fifth = len(series) // 5
    early, late = series[fifth:2 * fifth], series[-fifth:]
    rss = (statistics.median(s[1] for s in late) - statistics.median(s[1] for s in early)) / (1 << 20)
    fds = max(s[2] for s in late) - max(s[2] for s in early)
    return rss, fds


class Interrupted(Exception):
    """SIGTERM or SIGINT: unwind through every ``finally``, which stops the engine."""


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    # Once: a second signal would break off the engine's orderly stop (SIGKILL still works).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Interrupted(signal.Signals(signum).name)


def self_peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def check(engine: EngineProcess) -> tuple[list[str], float]:
    """``python -m engine check`` on the stopped store: (findings, the check's peak RSS in MiB)."""
    config_path = engine.store_dir.parent / f"{engine.store_dir.name}.toml"  # written by EngineProcess
    process = subprocess.Popen([sys.executable, "-m", "engine", "check", "--store-dir", str(engine.store_dir),
                                "--config", str(config_path), "--json"], stdout=subprocess.PIPE)
    try:
        output = process.stdout.read()  # type: ignore[union-attr]
        _pid, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
        process.stdout.close()  # type: ignore[union-attr]
    if process.returncode not in (0, 1):
        raise RuntimeError(f"check failed with exit code {process.returncode}")
    findings = [f"{f['area']} {f['where']}: {f['problem']}" for f in json.loads(output)]
    return findings, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=120)
    parser.add_argument("--kill-interval-s", type=float, default=20)
    parser.add_argument("--sample-interval-s", type=float, default=1)
    parser.add_argument("--flush-mode", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rss-growth-max-mib", type=float, default=32)
    parser.add_argument("--fds-growth-max", type=int, default=8)
    parser.add_argument("--rate-msgs-per-s", type=float, default=0, help="pace the load (0: as fast as acked)")
    parser.add_argument("--slope-window-min-s", type=float, default=1800,
                        help="shortest process lifetime a per-hour slope is fitted over")
    parser.add_argument("--self-rss-max-mib", type=float, default=500, help="the script's own peak RSS")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"seed={seed}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="soak-"))
    config = StoreConfig.test_min().replace(flush_mode=args.flush_mode, segment_size_bytes=64 << 20)
    engine = EngineProcess(base / "store", config=config)
    samples: dict[str, list[Sample]] = defaultdict(list)
    kills: list[str] = []
    try:
        engine.start()
        verdict = soak(engine, args, seed, base / "acks", samples, kills)
        engine.stop()
        findings, check_rss_mib = check(engine)
    except Interrupted as exc:
        print(f"interrupted by {exc}; stopping the engine", file=sys.stderr, flush=True)
        return 130
    finally:
        engine.stop()  # does nothing if already stopped
        shutil.rmtree(base, ignore_errors=True)
    self_rss_mib = self_peak_rss_mib()
    report = {"seed": seed, "duration_s": args.duration_s, "kills": kills, "acked": verdict.acked,
              "verdict": verdict.summary(),
              "check_findings": findings, "self_peak_rss_mib": round(self_rss_mib, 1),
              "check_peak_rss_mib": round(check_rss_mib, 1),
              "actors": {}}
    grew = []
    for name, series in sorted(samples.items()):
        rss_growth, fd_growth = growth(series)
        mib_per_hour, fds_per_hour = per_hour(series, args.slope_window_min_s)
        report["actors"][name] = {"private_mib_last": round(series[-1][1] / (1 << 20), 1),
                                  "private_growth_mib": round(rss_growth, 1), "fds_last": series[-1][2],
                                  "fds_growth": fd_growth, "lifetimes": len({s[3] for s in series}),
                                  "private_mib_per_hour": None if mib_per_hour is None else round(mib_per_hour, 2),
                                  "fds_per_hour": None if fds_per_hour is None else round(fds_per_hour, 2)}
        if rss_growth > args.rss_growth_max_mib or fd_growth > args.fds_growth_max:
            grew.append(name)
    ok = verdict.ok() and not findings and not grew and self_rss_mib <= args.self_rss_max_mib
    report["result"] = "PASS" if ok else "FAIL"
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if ok else 1


def soak(engine: EngineProcess, args: argparse.Namespace, seed: int, ack_dir: Path,
         samples: dict[str, list[Sample]], kills: list[str]) -> Verdict:
    """Load, sample and kill for ``--duration-s``, then check every acknowledged message."""
    rng = random.Random(seed)
    ack_log = AckLog(ack_dir, "soak", TOPICS)
    producer = Producer("soak", engine.client(timeout_ms=3_000), TOPICS, random.Random(seed), batch_size=16,
                        ack_log=ack_log)
    thread = ProducerThread(producer, batches_per_s=args.rate_msgs_per_s / producer.batch_size).start()
    try:
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
    finally:
        thread.stop()
        producer.client.close()
    try:
        with engine.client(timeout_ms=10_000) as client:
            wait_dispatched(client, timeout_ms=60_000)
            return verify_streaming(client, TOPICS, [ack_log])
    finally:
        ack_log.close()


if __name__ == "__main__":
    raise SystemExit(main())
