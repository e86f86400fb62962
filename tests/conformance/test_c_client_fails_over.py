"""The C client on a broker set's address follows a failover without an error (clients/c/README.md,
"A broker set's address"): three engines elected on a real etcd, SYNC replication, and the C client's
conformance driver sending one message at a time on the set's address (its op ``send_loop``) while
the master's whole process group is SIGKILLed, or SIGSTOPped past its lease.

Every send returns success: the client notices the lost connection at once (a kill) or within its
heartbeat timeout (a pause), asks the engines their ``route`` until one is master, and sends the same
frame there. The first success after the kill comes well before the request's deadline, and every
acknowledged message is read back from the new master.

The cluster client over two sets, one of them without a master: sends without a key pass it over
for the other set; a send keyed to it fails alone, at its deadline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine.config import StoreConfig
from engine.ipc import endpoints
from harness.broker_set import BrokerSet, broker_set, cluster_of_sets, wait_in_sync, wait_route_known
from harness.workload import wait_dispatched
from rmqpy.cluster import Cluster
from supervisor.etcd_server import ETCD
from supervisor.launcher import EngineProcess
from tests.conformance.test_clients import b64, drive
from tests.helpers import require

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # etcd, three engines and an election per test

DRIVER = Path(__file__).resolve().parents[2] / "clients" / "c" / "build" / "rmq_conformance"
TOPIC = "fails-over"
QUEUES = 2
TIMEOUT_MS = 10_000  # each send's deadline
FIRST_SUCCESS_BOUND_S = 8.0  # the first success after the kill, well before the deadline
SENDS_BEFORE = 20  # acknowledged sends before the fault
SENDS_AFTER = 20  # acknowledged sends at the new master before the loop is stopped (+ one in flight)
INTERVAL_MS = 40
LOOP_MS = 90_000  # the loop's bound in time; the test stops it sooner (its stop file)


def sync_config() -> StoreConfig:
    return StoreConfig.test_min().replace(replication_mode="SYNC", min_in_sync_replicas=1, replica_lag_max_ms=2_000,
                                          replication_report_interval_ms=200, replication_config_interval_ms=200,
                                          sync_flush_timeout_ms=2_000)


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[BrokerSet]:
    require(DRIVER.is_file(), f"{DRIVER} (make clients)")
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    with broker_set(tmp_path, sync_config(), engines=3) as brokers:
        master = brokers.wait_master()
        with master.client() as client:
            client.create_topic(TOPIC, queue_count=QUEUES)
        wait_in_sync(master, 2)
        yield brokers


class SendLoop:
    """The C driver's ``send_loop`` on the set's address, in its own process; its progress lines
    (stderr, one per send) counted by a thread, so that the test acts while it runs."""

    def __init__(self, address: str, prefix: str, stop_file: Path) -> None:
        self.stop_file = stop_file
        command = {"op": "send_loop", "topic": TOPIC, "body_prefix": prefix, "count": LOOP_MS // INTERVAL_MS,
                   "interval_ms": INTERVAL_MS, "duration_ms": LOOP_MS, "stop_file": str(stop_file)}
        self.process = subprocess.Popen([str(DRIVER), address, "--timeout-ms", str(TIMEOUT_MS)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps([command]).encode())
        self.process.stdin.close()
        self.acked = 0
        self.ended = False
        self.progress = threading.Condition()
        self.reader = threading.Thread(target=self._read_progress, name="send-loop-progress", daemon=True)
        self.reader.start()

    def _read_progress(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            words = line.split()
            with self.progress:
                if words[:1] == [b"sent"] and words[2:] == [b"1"]:
                    self.acked += 1
                self.progress.notify_all()
        with self.progress:
            self.ended = True
            self.progress.notify_all()

    def wait_acked(self, count: int, *, timeout_s: float) -> None:
        with self.progress:
            self.progress.wait_for(lambda: self.acked >= count or self.ended, timeout_s)
            acked = self.acked
        if acked < count:
            failed = [s for s in self.sends() if not s["ok"]]
            raise AssertionError(f"{acked} sends acknowledged, not {count}, within {timeout_s} s: {failed[:3]}")

    def sends(self) -> list[dict[str, Any]]:
        """Every send's outcome: the loop is stopped (its stop file) and its output read."""
        self.stop_file.touch()
        assert self.process.stdout is not None
        out = self.process.stdout.read()
        assert self.process.wait(timeout=60) == 0, out
        self.reader.join(10)
        [loop] = json.loads(out)
        assert loop["ok"], loop
        sends: list[dict[str, Any]] = loop["sends"]
        return sends

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def send_loop(address: str, prefix: str, stop_file: Path) -> Iterator[SendLoop]:
    loop = SendLoop(address, prefix, stop_file)
    try:
        yield loop
    finally:
        loop.close()


def stored_messages(master: EngineProcess) -> list[tuple[bytes, str]]:
    """Every message of the topic on ``master``: its body and its uniq_key."""
    with master.client(timeout_ms=5_000) as client:
        wait_dispatched(client, timeout_ms=60_000)
        stored = []
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                reply = client.pull(TOPIC, queue_id, offset, max_messages=256)
                stored += [(bytes(m["body"]), str(m["uniq_key"])) for m in reply["messages"]]
                if not reply["messages"]:
                    break
                offset = reply["next_offset"]
        return stored


def check_every_send_succeeded(sends: list[dict[str, Any]], fault_at_ms: float, new: EngineProcess,
                               prefix: str, what: str, *, bound_s: float | None) -> None:
    """No send failed, the last is at the new master, every one is stored there with the UNIQ_KEY the
    client gave it (twice at most, a send sent again), and the first success after the fault came
    within ``bound_s`` (None: printed only)."""
    failed = [s for s in sends if not s["ok"]]
    assert not failed, f"{len(failed)} of {len(sends)} sends failed: {failed[:3]}"
    after = [s for s in sends if s["ended_ms"] > fault_at_ms and s["endpoint"] == new.endpoint]
    assert len(after) >= SENDS_AFTER, f"only {len(after)} sends at the new master after the {what}"
    first_s = (after[0]["ended_ms"] - fault_at_ms) / 1000  # the first one the new master answered
    longest_s = max(s["ended_ms"] - s["started_ms"] for s in sends) / 1000
    print(f"\nC client, master {what}: first success at the new master {first_s:.2f} s after it "
          f"(deadline {TIMEOUT_MS / 1000:.0f} s), longest send {longest_s:.2f} s, {len(sends)} sends, "
          f"{len(after)} at the new master")
    assert sends[-1]["endpoint"] == new.endpoint
    stored = stored_messages(new)
    acked = {f"{prefix}{s['i']}".encode(): s["uniq_key"] for s in sends}
    missing = sorted(set(acked) - {body for body, _ in stored})
    assert not missing, f"{len(missing)} acknowledged messages are not stored: {missing[:5]}"
    assert len(set(acked.values())) == len(acked) and all(len(k) == 32 for k in acked.values())
    assert [(body, key) for body, key in stored if acked.get(body) != key] == [], "a UNIQ_KEY changed on a resend"
    print(f"stored {len(stored)} messages for {len(acked)} acknowledged sends (a send whose connection broke "
          f"is sent again: {len(stored) - len(acked)} stored twice, with one UNIQ_KEY)")
    assert bound_s is None or first_s < bound_s, f"the first success came {first_s:.1f} s after the {what}"


def test_master_killed_the_c_client_sends_on_without_an_error(brokers: BrokerSet, tmp_path: Path) -> None:
    old = brokers.wait_master()
    with send_loop(brokers.endpoints, "killed-", tmp_path / "stop") as loop:
        loop.wait_acked(SENDS_BEFORE, timeout_s=60)
        acked = loop.acked
        killed_at_ms = time.monotonic() * 1000
        old.kill()
        try:
            new = brokers.wait_master(other_than=old)
            print(f"\nthe new master serves {time.monotonic() - killed_at_ms / 1000:.2f} s after the kill")
            loop.wait_acked(acked + SENDS_AFTER + 1, timeout_s=60)
            sends = loop.sends()
            check_every_send_succeeded(sends, killed_at_ms, new, "killed-", "killed", bound_s=FIRST_SUCCESS_BOUND_S)
        finally:
            shutil.rmtree(endpoints.run_dir_for(old.store_dir), ignore_errors=True)  # the killed engine's sockets


def test_master_paused_the_c_client_reaches_the_new_master_without_an_error(brokers: BrokerSet,
                                                                            tmp_path: Path) -> None:
    old = brokers.wait_master()
    with send_loop(brokers.endpoints, "paused-", tmp_path / "stop") as loop:
        loop.wait_acked(SENDS_BEFORE, timeout_s=60)
        acked = loop.acked
        with brokers.paused(old):  # SIGCONT in its finally, whatever happens here
            paused_at_ms = time.monotonic() * 1000
            new = brokers.wait_master(other_than=old)
            print(f"\nthe new master serves {time.monotonic() - paused_at_ms / 1000:.2f} s after the pause")
            loop.wait_acked(acked + SENDS_AFTER + 1, timeout_s=60)  # at the new master while the old one sleeps
        sends = loop.sends()
    # The pause's figure is printed, not bounded: the election waits for the paused master's lease.
    check_every_send_succeeded(sends, paused_at_ms, new, "paused-", "paused", bound_s=None)


def key_of_set(queues_a: int, queues: int, *, in_a: bool) -> str:
    """A sharding key whose queue (its CRC-32 among the route's queues, broker-a's first) is in
    broker-a's share of the route, or in broker-b's."""
    for n in range(1000):
        key = f"key-{n}"
        if (zlib.crc32(key.encode()) % queues < queues_a) == in_a:
            return key
    raise AssertionError("no key found")


@pytest.fixture
def two_sets(tmp_path: Path) -> Iterator[list[BrokerSet]]:
    require(DRIVER.is_file(), f"{DRIVER} (make clients)")
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    with cluster_of_sets(tmp_path, StoreConfig.test_min().replace(auto_create_topic=False), sets=2) as sets:
        for one in sets:
            one.wait_master()
        Cluster(sets[0].etcd.endpoints).create_topic(TOPIC, queue_count=2 * QUEUES)
        for one in sets:
            wait_route_known(one.engines[0], TOPIC, 2)
        yield sets


def test_the_cluster_client_passes_a_set_without_master_over_and_a_keyed_send_fails_alone(
        two_sets: list[BrokerSet]) -> None:
    """broker-b's only engine killed: sends without a key all go to broker-a, with no error; a send
    keyed to one of broker-b's queues fails alone at its deadline, and the sends after it go on."""
    a, b = (one.engines[0] for one in two_sets)
    body = b64(b"spread")
    b.kill()
    try:
        keyless, keyed, after = drive("c", a.endpoint, [
            {"op": "cluster_send", "topic": TOPIC, "count": 8, "body_b64": body},
            {"op": "cluster_send", "topic": TOPIC, "body_b64": body,
             "sharding_key": key_of_set(QUEUES, 2 * QUEUES, in_a=False)},
            {"op": "cluster_send", "topic": TOPIC, "count": 4, "body_b64": body}], timeout_ms=3_000)
    finally:
        b.start()  # its run directory goes with the cluster's stop
    assert keyless["ok"] and after["ok"], (keyless, after)
    assert {s["broker_name"] for s in keyless["sent"] + after["sent"]} == {"broker-a"}
    assert (keyed["ok"], keyed["name"]) in {(False, "CONNECTION_LOST"), (False, "SERVICE_NOT_AVAILABLE")}, keyed
    with a.client() as client:
        assert sum(client.queue_stats(TOPIC, q)["max_offset"] for q in range(QUEUES)) == 12
