"""A broker set elected on etcd, on loopback: an etcd of one or three members and N engines
(``broker_id`` 0..N-1), each with its own store and replication endpoint. For the failover tests.

``BrokerSet.master()`` is the engine whose run directory says it is master of the newest epoch;
``wait_master`` waits, with a deadline, for one (another than a given one) to serve.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import zmq

import rmqpy
from engine.client import ClientError, EngineError, StoreClient
from engine.config import StoreConfig
from engine.coordination.role import Role
from engine.ipc.endpoints import ensure_run_dir
from harness.replication import log_bytes, offsets
from harness.workload import Producer, ProducerThread, QueueRead
from supervisor.etcd_server import EtcdCluster
from supervisor.launcher import EngineProcess, free_port


@dataclass
class BrokerSet:
    etcd: EtcdCluster
    engines: list[EngineProcess]
    context: zmq.Context[zmq.Socket[bytes]] | None = None  # how this process reaches them (a test bed's host)

    @property
    def endpoints(self) -> str:
        """The broker set's address for rmqpy: every engine's endpoint."""
        return ",".join(engine.endpoint for engine in self.engines)

    def role(self, engine: EngineProcess) -> Role | None:
        return Role.load(ensure_run_dir(engine.store_dir))

    def master(self) -> EngineProcess | None:
        best: tuple[int, EngineProcess] | None = None
        for engine in self.engines:
            role = self.role(engine) if engine.process is not None else None
            if role is not None and role.is_master and (best is None or role.epoch > best[0]):
                best = (role.epoch, engine)
        return best[1] if best else None

    def wait_master(self, *, other_than: EngineProcess | None = None, timeout_s: float = 30.0) -> EngineProcess:
        """The master, once its actors serve as master's (not ``other_than``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            master = self.master()
            if master is not None and master is not other_than:
                try:
                    with StoreClient(master.endpoint, timeout_ms=1_000, context=self.context) as client:
                        if client.route()["role"] == "master":  # its actors run as master's now
                            return master
                except ClientError:
                    pass
            time.sleep(0.05)  # polls files and a status: the roles change in other processes
        raise TimeoutError(f"no master within {timeout_s} s")

    def serving(self, timeout_s: float = 60.0) -> EngineProcess:
        """The master, once it serves and has every other engine of the set in sync."""
        master = self.wait_master(timeout_s=timeout_s)
        wait_in_sync(master, len(self.engines) - 1, timeout_s=timeout_s)
        return master

    @contextmanager
    def paused(self, engine: EngineProcess) -> Iterator[None]:
        """The engine's supervisor and every actor of it stopped (SIGSTOP: a pause that looks like a
        partition), and resumed (SIGCONT) at the end of the block."""
        signal_tree(engine.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            signal_tree(engine.pid, signal.SIGCONT)

    @contextmanager
    def producing(self, topics: dict[str, int], seed: int, *, name: str = "p") -> Iterator[ProducerThread]:
        """A workload producer (``harness.workload``) on the set's address, in a thread, stopped at the end."""
        producer = Producer(name, ProducerOnSet(self.endpoints, timeout_ms=3_000), topics,  # type: ignore[arg-type]
                            random.Random(seed))
        thread = ProducerThread(producer).start()
        try:
            yield thread
        finally:
            thread.stop()
            producer.client.close()

    @contextmanager
    def consuming(self, topics: dict[str, int]) -> Iterator[ConsumerOnSet]:
        """A consumer pulling every queue from whichever engine is master, in a thread, stopped at the end."""
        consumer = ConsumerOnSet(self, topics)
        consumer.thread.start()
        try:
            yield consumer
        finally:
            consumer.stop.set()
            consumer.thread.join(30)


class ConsumerOnSet:
    """Pulls each queue onward from the engine whose role is master, as a consumer of the set does,
    and keeps what it read at each position: under SYNC replication a reader sees only what every
    in-sync replica holds, so no failover may take back or change what it read (``changed``)."""

    def __init__(self, brokers: BrokerSet, topics: dict[str, int]) -> None:
        self.brokers = brokers
        self.queues = [(topic, queue_id) for topic, count in topics.items() for queue_id in range(count)]
        self.read: dict[tuple[str, int, int], bytes] = {}  # (topic, queue id, queue offset) -> body
        self.next_offset = dict.fromkeys(self.queues, 0)
        self.masters: set[int] = set()  # the broker ids it read from
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="consumer-on-set", daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            master = self.brokers.master()
            if master is None:
                self.stop.wait(0.05)  # an election under way
                continue
            try:
                with StoreClient(master.endpoint, timeout_ms=2_000) as client:
                    while not self.stop.is_set() and self.brokers.master() is master:
                        if not self.pull_each(client):
                            self.stop.wait(0.02)  # nothing new: the producer's next batch
                        self.masters.add(master.config.broker_id)
            except (ClientError, EngineError):
                self.stop.wait(0.05)  # the master died or steps down: the next one

    def pull_each(self, client: StoreClient) -> int:
        got = 0
        for topic, queue_id in self.queues:
            reply = client.pull(topic, queue_id, self.next_offset[(topic, queue_id)], max_messages=64)
            for message in reply["messages"]:
                self.read[(topic, queue_id, message["queue_offset"])] = bytes(message["body"])
                got += 1
            if reply["messages"]:
                self.next_offset[(topic, queue_id)] = reply["next_offset"]
        return got

    def changed(self, stored: dict[tuple[str, int], QueueRead]) -> list[str]:
        """Positions read during the run that the store no longer holds as they were read."""
        now = {(topic, queue_id, m["queue_offset"]): bytes(m["body"])
               for (topic, queue_id), queue in stored.items() for m in queue.messages}
        return [f"{topic}/{queue_id}@{offset}" for (topic, queue_id, offset), body in sorted(self.read.items())
                if now.get((topic, queue_id, offset)) != body]


def signal_tree(pid: int, sig: signal.Signals) -> None:
    """``sig`` to a process and every descendant (a SIGSTOP stops it first, so that no child it
    starts meanwhile is missed)."""
    try:
        root = psutil.Process(pid)
        if sig == signal.SIGSTOP:
            os.kill(pid, sig)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in family:
        try:
            os.kill(process.pid, sig)
        except ProcessLookupError:
            pass


def replicas_differing(brokers: BrokerSet, master: EngineProcess, start: int, end: int,
                       config: StoreConfig, *, timeout_s: float = 60.0) -> list[str]:
    """The engines whose log [start, end) is not the master's byte for byte, once each has written
    to ``end`` (or ``timeout_s`` passed)."""
    expected = log_bytes(master.store_dir, start, end, config.segment_size_bytes)
    differing = []
    deadline = time.monotonic() + timeout_s
    for engine in brokers.engines:
        if engine is master:
            continue
        with engine.client(timeout_ms=2_000) as client:
            while offsets(client)["written_offset"] < end and time.monotonic() < deadline:
                time.sleep(0.05)  # polls the replica's status: it catches up in other processes
        if log_bytes(engine.store_dir, start, end, config.segment_size_bytes) != expected:
            differing.append(f"{engine.store_dir.name} in [{start}, {end})")
    return differing


def wait_route_known(engine: EngineProcess, topic: str, brokers: int, *, timeout_s: float = 15.0) -> list[Any]:
    """The topic's route as ``engine`` answers it, once it names ``brokers`` sets (each engine mirrors
    the cluster's routes every ``cluster_routes_refresh_ms``)."""
    deadline = time.monotonic() + timeout_s
    with engine.client() as client:
        while True:
            route: list[Any] = client.request("route", topic=topic)["topic_route"]
            if len(route) >= brokers:
                return route
            if time.monotonic() > deadline:
                raise TimeoutError(f"{engine.endpoint} knows {route} for {topic!r} after {timeout_s} s")
            time.sleep(0.05)


def wait_in_sync(master: EngineProcess, replicas: int, *, timeout_s: float = 60.0) -> None:
    """Until the master has ``replicas`` replicas in sync."""
    deadline = time.monotonic() + timeout_s
    with master.client(timeout_ms=2_000) as client:
        while offsets(client).get("in_sync_replicas", 0) < replicas:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {replicas} replicas in sync: {offsets(client)}")
            time.sleep(0.05)  # polls the master's status: the replicas catch up in other processes


@contextmanager
def broker_set(root: Path, config: StoreConfig, *, engines: int = 3, etcd_members: int = 1) -> Iterator[BrokerSet]:
    """Start etcd, then the engines in broker_id order (the first is elected master), and stop all."""
    with cluster_of_sets(root, config, sets=1, engines=engines, etcd_members=etcd_members) as [only]:
        yield only


@contextmanager
def cluster_of_sets(root: Path, config: StoreConfig, *, sets: int = 2, engines: int | Sequence[int] = 1,
                    etcd_members: int = 1) -> Iterator[list[BrokerSet]]:
    """A cluster: ``sets`` broker sets (``broker-a``, ``broker-b``, ...) of ``engines`` engines each (or
    each its own count), on one etcd; each set's engines start in broker_id order (the first is elected
    master). One set keeps the store directories ``broker-<id>`` (``broker_set``); more get
    ``<broker name>-<id>``. With a ``metrics_endpoint`` in ``config``, each engine serves its metrics
    on a free port of its own."""
    counts = [engines] * sets if isinstance(engines, int) else list(engines)
    assert len(counts) == sets, (sets, engines)
    etcd = EtcdCluster(root / "etcd", [(free_port(), free_port()) for _ in range(etcd_members)])
    etcd.start()
    started: list[EngineProcess] = []
    try:
        brokers = []
        for index in range(sets):
            name = f"broker-{chr(ord('a') + index)}"
            members = []
            for broker_id in range(counts[index]):
                store = root / (f"broker-{broker_id}" if sets == 1 else f"{name}-{broker_id}")
                engine = EngineProcess(store, config=config.replace(
                    etcd_endpoints=etcd.endpoints, broker_id=broker_id, broker_name=name,
                    replication_endpoint=f"tcp://127.0.0.1:{free_port()}", grpc_endpoint=f"127.0.0.1:{free_port()}",
                    metrics_endpoint=f"127.0.0.1:{free_port()}" if config.metrics_endpoint else ""))
                engine.start()
                started.append(engine)
                members.append(engine)
            brokers.append(BrokerSet(etcd, members))
        yield brokers
    finally:
        for engine in reversed(started):
            engine.stop()
        etcd.stop()


class ProducerOnSet:
    """``rmqpy.Producer`` on a broker set's address, shaped as ``harness.workload.Producer``'s client:
    ``send(topic, batch, queue_id=)`` answers the wire's result maps, each with ``resent`` when rmqpy
    sent the batch again after its connection broke (the batch may then be stored twice); a refusal
    (after rmqpy's own retries) or a timeout is raised as the StoreClient would."""

    def __init__(self, endpoints: str, *, timeout_ms: int) -> None:
        self.producer = rmqpy.Producer(endpoints, timeout_ms=timeout_ms)

    def send(self, topic: str, batch: list[dict[str, Any]], *, queue_id: int) -> list[dict[str, Any]]:
        messages = [rmqpy.OutgoingMessage(body=m["body"], keys=tuple(m.get("keys", ())), tags=m.get("tags"))
                    for m in batch]
        resends = self.producer.resends
        results = self.producer.send_batch(topic, messages, queue_id=queue_id)
        resent = self.producer.resends > resends  # sent again after a break: it may be stored twice
        return [{"status": r.status, "queue_offset": r.queue_offset, "commit_log_offset": r.commit_log_offset,
                 "resent": resent} for r in results]

    def close(self) -> None:
        self.producer.close()
