"""Figures a deployment is sized by, measured on the test bed of hosts (network namespaces).

    sudo python scripts/bench_testbed.py --failover 50 --rtt-ms 0.2,2            # masters SIGKILLed
    sudo python scripts/bench_testbed.py --failover 20 --fault master-etcd --hold-s 6
    sudo python scripts/bench_testbed.py --produce --rtt-ms 0.2,2,20             # SYNC produce

``--failover N``: three engines (SYNC) on three etcd members and a client host, every link held
``rtt/2`` each way (harness/testbed/run.py); N times the fault (``--fault``: kill-engine, the
master SIGKILLed; master-etcd or master-clients, the master cut off) falls on the master, is held
``--hold-s`` seconds (a killed master starts again then) and healed. Printed per round trip: from
the fault to the acknowledgement of the first send begun after it, median, min and max, and the
checker's verdict over every send (lost: acknowledged and not stored; must be 0).

``--produce``: the same set with its replicas ``rtt/2`` away each way (the client on the
master's host: its own sends cross no link); produce 100,000 messages of 256 B in batches of
1,000, one in flight (msg/s), then 1,000 single sends one at a time (p50, p99 ms), beside the
master alone (no replica, ASYNC) and the replicas on links without the relay (the relay's own
cost: a Python copy, and asyncio's timers, whose resolution is a millisecond). Needs root,
iproute2 and nftables (``make system-tools``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import body_of, percentile

from engine.client import StoreClient
from harness.broker_set import wait_in_sync
from harness.testbed import TestBed
from harness.testbed.cluster import broker_set_on
from harness.testbed.run import Campaign, run_config

TOTAL, BATCH, BODY, SINGLES = 100_000, 1_000, 256, 1_000


def failover(root: Path, rtt_ms: float, kills: int, fault: str, hold_s: float) -> None:
    with Campaign(root / f"failover-{rtt_ms}", kinds=(fault,), rtt_ms=rtt_ms) as campaign:
        report = campaign.run(0, faults=kills, on_master=True, hold_s=hold_s)
    assert report.verdict is not None, report.summary()
    firsts = [seconds * 1000 for _, seconds in report.verdict.first_ack_s]
    lost = len(report.verdict.anomalies.get("lost", []))
    print(f"rtt {rtt_ms} ms, {fault} x{len(firsts)} (held {hold_s} s): first acknowledgement after the fault "
          f"{statistics.median(firsts):,.0f} ms median, {min(firsts):,.0f} min, {max(firsts):,.0f} max; "
          f"lost {lost}; {report.verdict.summary()}{' STUCK ' + str(report.stuck) if report.stuck else ''}",
          flush=True)


def produce(root: Path, rtt_ms: float | None, *, alone: bool = False) -> None:
    """``rtt_ms`` None: no relay on the links (the veth pairs and the bridge alone)."""
    engines = ["e0"] if alone else ["e0", "e1", "e2"]
    with TestBed(root / f"produce-{rtt_ms}-{alone}", [*engines, "m0"], relayed=rtt_ms is not None) as bed:
        if rtt_ms is not None:
            bed.base_delay(rtt_ms / 2)
        config = run_config("ASYNC" if alone else "SYNC").replace(segment_size_bytes=64 << 20)  # as bench_replication
        with broker_set_on(bed, bed.root, config, engines=engines, etcd=["m0"], client="e0") as brokers:
            master = brokers.wait_master()
            host = engines[brokers.engines.index(master)]
            if not alone:
                wait_in_sync(master, 2)
            away = "no relay" if rtt_ms is None else f"{rtt_ms} ms round trip away"
            label = f"master alone ({away})" if alone else f"SYNC, replicas {away}"
            with StoreClient(master.endpoint, timeout_ms=60_000, context=bed.context(host)) as client:
                client.create_topic("bench", queue_count=4)
                batches = [[{"body": body_of(BODY, i)} for i in range(first, first + BATCH)]
                           for first in range(0, TOTAL, BATCH)]
                began = time.perf_counter()
                for batch in batches:
                    client.send("bench", batch)
                rate = TOTAL / (time.perf_counter() - began)
                took = []
                for i in range(SINGLES):
                    began = time.perf_counter()
                    client.send("bench", [{"body": body_of(BODY, i)}])
                    took.append((time.perf_counter() - began) * 1000)
            print(f"{label}: produce batch={BATCH}, 1 in flight {rate:,.0f} msg/s; single send "
                  f"p50 {percentile(took, 0.5):.3f} ms, p99 {percentile(took, 0.99):.3f} ms", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--failover", type=int, default=0, metavar="N", help="N faults on the master")
    parser.add_argument("--fault", choices=("kill-engine", "master-etcd", "master-clients"), default="kill-engine")
    parser.add_argument("--hold-s", type=float, default=4.0, help="how long each fault is held (default 4)")
    parser.add_argument("--produce", action="store_true", help="SYNC produce and single sends")
    parser.add_argument("--rtt-ms", default="0.2,2", help="round trips, separated by commas (default 0.2,2)")
    parser.add_argument("--keep", type=Path, help="the folder the stores and logs stay in")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the test bed makes network namespaces: run it as root")
    if not args.failover and not args.produce:
        parser.error("say what to measure: --failover N and/or --produce")
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-testbed-"))
    rtts = [float(rtt) for rtt in args.rtt_ms.split(",")]
    if args.produce:
        produce(root, None, alone=True)
        produce(root, None)
        for rtt in rtts:
            produce(root, rtt)
    for rtt in rtts if args.failover else []:
        failover(root, rtt, args.failover, args.fault, args.hold_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
