"""What an application feels of a failover (docs/replication.md, "Clients"): nothing but the seconds the
set takes to elect a master. A producer on a broker set's address whose master is killed raises nothing
(``NOT_MASTER`` during the election is retried inside it) and sends again as soon as a master serves; a
cluster's producer goes on sending to the other sets while one set elects, and a keyed send to that set
waits for its new master alone. The command line's ``produce`` on a set's address does not stop either.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.client import ClientError
from harness.broker_set import broker_set, cluster_of_sets, wait_in_sync, wait_route_known
from rmqpy import Cluster, ClusterProducer, Producer, SendResult
from supervisor.etcd_server import ETCD
from tests.helpers import require
from tests.replication.test_failover import sync_config

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
TIMEOUT_MS = 10_000  # the request deadline: a producer stuck on a dead master would wait this long
SENDS_MAX = 20_000  # every loop is bounded in count ...
RUN_S_MAX = 90.0  # ... and in time


@dataclass
class Sends:
    """A loop of sends in a thread, each outcome kept with its time."""

    send: Callable[[int], SendResult]
    acked: list[tuple[float, SendResult]] = field(default_factory=list)
    failed: list[tuple[float, ClientError]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        ends = time.monotonic() + RUN_S_MAX
        for n in range(SENDS_MAX):
            if self.stop.is_set() or time.monotonic() > ends:
                return
            try:
                result = self.send(n)
            except ClientError as exc:
                self.failed.append((time.monotonic(), exc))
            else:
                self.acked.append((time.monotonic(), result))

    def wait_acked(self, count: int, *, after: float = 0.0, timeout_s: float = 60.0) -> float:
        """The time of the ``count``-th acknowledgement after ``after``, waited for."""
        deadline = time.monotonic() + timeout_s
        while True:
            times = [at for at, _ in self.acked if at > after]
            if len(times) >= count:
                return times[count - 1]
            assert time.monotonic() < deadline and self.thread.is_alive(), \
                f"{len(times)} of {count} acknowledgements; failures: {self.failed[-3:]}"
            time.sleep(0.02)  # polls the sending thread's list

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(TIMEOUT_MS / 1000 + 5)


def test_a_producer_on_a_set_whose_master_is_killed_raises_nothing_and_moves_on(tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    with broker_set(tmp_path, sync_config(), engines=3) as brokers:
        old = brokers.wait_master()
        with old.client() as client:
            client.create_topic("orders", queue_count=2)
        wait_in_sync(old, 2)
        with Producer(brokers.endpoints, timeout_ms=TIMEOUT_MS) as producer:
            sends = Sends(lambda n: producer.send("orders", b"%d" % n))
            try:
                sends.wait_acked(100)
                old.kill()
                killed = time.monotonic()
                first = sends.wait_acked(1, after=killed)
                sends.wait_acked(100, after=killed)
            finally:
                sends.finish()
        new = brokers.wait_master(other_than=old)
        old.start()  # it follows the new master (and a stopped engine leaves no run directory behind)
        assert sends.failed == [], f"the application felt the failover: {sends.failed[:3]}"
        took_s = first - killed
        print(f"first acknowledgement {took_s:.2f} s after the kill")
        assert took_s < TIMEOUT_MS / 1000 - 2, f"the producer sent again only {took_s:.1f} s after the kill"
        with new.client() as client:
            stored = sum(client.queue_stats("orders", q)["max_offset"] for q in range(2))
        assert stored >= len(sends.acked)  # none acknowledged is lost (a resend after a break may store twice)


def test_a_cluster_producer_goes_on_with_the_other_sets_while_one_elects_and_a_keyed_send_waits_alone(
        tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    config = sync_config().replace(replication_mode="ASYNC", auto_create_topic=False)  # a set of one has no replica
    with cluster_of_sets(tmp_path, config, sets=2, engines=[1, 3]) as (steady, electing):
        steady.wait_master()
        old = electing.wait_master()
        wait_in_sync(old, 2)
        with Cluster(steady.etcd.endpoints) as cluster:
            route = cluster.create_topic("orders", queue_count=4)
            wait_route_known(steady.engines[0], "orders", 2)
            key = next(f"key-{n}" for n in range(1_000)
                       if route.send_order(f"key-{n}", 0)[0][0] == electing.engines[0].config.broker_name)
            with ClusterProducer(cluster, timeout_ms=TIMEOUT_MS) as producer:
                keyless = Sends(lambda n: producer.send("orders", b"%d" % n))
                keyed = Sends(lambda n: producer.send("orders", b"keyed %d" % n, sharding_key=key))
                try:
                    keyless.wait_acked(100)
                    keyed.wait_acked(20)
                    old.kill()
                    killed = time.monotonic()
                    steady_after = keyless.wait_acked(50, after=killed)
                    keyed_first = keyed.wait_acked(1, after=killed)
                    keyless.wait_acked(50, after=keyed_first)
                finally:
                    keyless.finish()
                    keyed.finish()
        old.start()  # it follows the new master (and a stopped engine leaves no run directory behind)
    assert keyless.failed == [] and keyed.failed == [], (keyless.failed[:3], keyed.failed[:3])
    gaps = [b - a for (a, _), (b, _) in zip(keyless.acked, keyless.acked[1:], strict=False) if b > killed]
    print(f"50 keyless acks {steady_after - killed:.2f} s after the kill; keyed send waited "
          f"{keyed_first - killed:.2f} s; longest keyless gap {max(gaps):.2f} s")
    assert max(gaps) < 2.0, f"keyless sends stalled {max(gaps):.1f} s while one set elected its master"
    # While the set elected (until its first acknowledgement after the kill: its new master serves
    # from then on, and keyless sends may reach it before the keyed send's next look does), keyless
    # sends were acknowledged by the other set.
    electing_name = electing.engines[0].config.broker_name
    elected = min(at for at, r in [*keyless.acked, *keyed.acked] if at > killed and r.broker_name == electing_name)
    during = [at for at, r in keyless.acked if killed < at < elected]
    assert during, "no keyless send was acknowledged while the set elected"
    assert {r.broker_name for _, r in keyed.acked} == {electing_name}


def test_the_cli_producing_to_a_set_whose_master_is_killed_sends_everything(tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    with broker_set(tmp_path, sync_config(), engines=3) as brokers:
        old = brokers.wait_master()
        with old.client() as client:
            client.create_topic("orders", queue_count=2)
        wait_in_sync(old, 2)
        count = 3_000
        produce = subprocess.Popen([sys.executable, "-m", "engine", "produce", "--endpoint", brokers.endpoints,
                                    "--topic", "orders", "--count", str(count), "--batch-size", "5", "--json"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            with old.client() as client:
                deadline = time.monotonic() + 60
                while sum(client.queue_stats("orders", q)["max_offset"] for q in range(2)) < 200:
                    assert time.monotonic() < deadline and produce.poll() is None, "produce did not get going"
                    time.sleep(0.02)  # polls the master's queues while produce sends
            old.kill()
            out, err = produce.communicate(timeout=120)
        finally:
            produce.kill()
        assert produce.returncode == 0, err
        assert json.loads(out)["sent"] == count
        new = brokers.wait_master(other_than=old)
        old.start()  # it follows the new master (and a stopped engine leaves no run directory behind)
        with new.client() as client:
            assert sum(client.queue_stats("orders", q)["max_offset"] for q in range(2)) >= count
