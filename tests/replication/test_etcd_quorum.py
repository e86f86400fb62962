"""An etcd of three members loses one and a client sees nothing of it (docs/operations.md, "etcd in
production"): real etcd members, a broker set elected on them, an rmqpy producer sending throughout.

The member killed is the worst one to lose: the one the engines' requests go to (they use the
first endpoint until it fails, ``engine/coordination/etcd.py``; etcd's own request counters say
which it is), made etcd's Raft leader first, so the engines move to another endpoint while etcd
elects another leader. Every send before, during and after is acknowledged, and the master keeps
its role and its epoch: its lease lives through etcd's election (the new leader extends every
lease), so no election of ours happens.

Two of three lost: the master stops taking writes within its lease and keeps its role; with the
members back, the same master takes writes again in the same epoch.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from urllib.request import Request, urlopen

import pytest

import rmqpy
from engine.client import EngineError
from engine.config import StoreConfig
from engine.errors import ErrorCode
from engine.ipc.control import control
from engine.ipc.messages import StatusQuery
from harness.broker_set import broker_set, wait_in_sync
from supervisor.etcd_server import ETCD, EtcdCluster, EtcdMember, member_health, member_ports
from supervisor.launcher import free_port
from tests.helpers import require

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # three etcd members and two engines: 40-90 s each here

TOPIC = "orders"
SENT_AFTER_KILL_MIN = 200
# etcd's election (1 s of election timeout) and then twice the lease, sending all the while
SENDING_AFTER_KILL_S = 1.0 + 2 * StoreConfig.test_min().master_lease_ms / 1000


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = Request(url, data=json.dumps(body).encode(), method="POST")
    with urlopen(request, timeout=2) as reply:
        answer: dict[str, object] = json.loads(reply.read())
    return answer


def _member_id(member: EtcdMember) -> str:
    header = _post(member.client_url + "/v3/maintenance/status", {})["header"]
    assert isinstance(header, dict)
    return str(header["member_id"])


def _requests_served(member: EtcdMember) -> int:
    """The client requests ``member`` answered (etcd's gRPC counters: the JSON gateway goes through them)."""
    with urlopen(member.client_url + "/metrics", timeout=2) as reply:
        lines = reply.read().decode().splitlines()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in lines
               if line.startswith('grpc_server_handled_total{grpc_code="OK"')
               and any(f'grpc_method="{method}"' in line for method in ("Range", "Put", "Txn")))


def _talked_to(members: list[EtcdMember], *, timeout_s: float = 20.0) -> int:
    """The member the engines send their requests to: the one whose count of answered requests grows."""
    before = [_requests_served(member) for member in members]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        grown = [_requests_served(member) - count for member, count in zip(members, before, strict=True)]
        if max(grown) >= 10:  # the membership actors' ticks: a get and a put every second or so each
            return grown.index(max(grown))
        time.sleep(0.1)  # polls etcd's counters: the engines' requests come from other processes
    raise TimeoutError(f"no etcd member served the engines' requests within {timeout_s} s")


def _make_leader(members: list[EtcdMember], k: int) -> None:
    leader = next(m for m in members if member_health(m.client_url).leader)
    if leader is not members[k]:
        _post(leader.client_url + "/v3/maintenance/transfer-leadership", {"targetID": _member_id(members[k])})
    deadline = time.monotonic() + 10
    while not member_health(members[k].client_url).leader:
        assert time.monotonic() < deadline, "etcd did not move its leadership"
        time.sleep(0.05)  # polls etcd's status: the transfer is etcd's


def test_the_member_the_engines_talk_to_killed_sends_go_on_and_the_master_keeps_its_epoch(tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    config = StoreConfig.test_min().replace(replication_mode="SYNC", min_in_sync_replicas=1,
                                            replica_lag_max_ms=2_000, replication_report_interval_ms=200,
                                            sync_flush_timeout_ms=2_000)
    with broker_set(tmp_path, config, engines=2, etcd_members=3) as brokers:
        master = brokers.wait_master()
        with master.client() as client:
            client.create_topic(TOPIC, queue_count=2)
        wait_in_sync(master, 1)
        role = brokers.role(master)
        assert role is not None
        members = brokers.etcd.members
        victim = _talked_to(members)
        _make_leader(members, victim)
        statuses: list[str] = []
        killed_at = 0.0
        with rmqpy.Producer(brokers.endpoints, timeout_ms=5_000) as producer:
            for n in range(100_000):  # bounded: it ends once enough was sent for long enough after the kill
                statuses.append(producer.send(TOPIC, b"message %d" % n).status)
                if n == 100:
                    brokers.etcd.kill_member(victim)
                    killed_at = time.monotonic()
                if killed_at and n >= 100 + SENT_AFTER_KILL_MIN and \
                        time.monotonic() - killed_at >= SENDING_AFTER_KILL_S:
                    break
        assert statuses == ["PUT_OK"] * len(statuses)
        assert not member_health(members[victim].client_url).up
        assert sum(member_health(m.client_url).leader for m in members) == 1  # the two others elected one
        assert brokers.master() is master
        kept = brokers.role(master)
        assert kept is not None and kept.is_master and kept.epoch == role.epoch, (role, kept)
        with master.client() as client:
            assert client.route()["epoch"] == role.epoch


def test_a_majority_of_members_lost_writes_stop_within_the_lease_and_the_same_master_resumes(tmp_path: Path) -> None:
    """Two of three members killed: no quorum, so etcd renews no lease and elects nothing. The master
    keeps its role but refuses writes (``NOT_MASTER``) once its lease could have ended unrenewed
    (``master_lease_ms - master_fence_margin_ms`` after its last renewal); reads go on. The members
    started again, etcd has its quorum back with the lease alive (a new etcd leader extends every
    lease), and the same master takes writes again in the same epoch: nothing was elected."""
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    config = StoreConfig.test_min().replace(replication_mode="ASYNC")
    with broker_set(tmp_path, config, engines=2, etcd_members=3) as brokers:
        master = brokers.wait_master()
        role = brokers.role(master)
        assert role is not None
        with master.client(timeout_ms=5_000) as client:
            client.create_topic(TOPIC, queue_count=1)
            client.send(TOPIC, [{"body": b"before"}])
            lost = [0, 1]
            for k in lost:
                brokers.etcd.kill_member(k)
            deadline = time.monotonic() + 15
            refused = None
            while refused is None:
                assert time.monotonic() < deadline, "the master still took writes without etcd's quorum"
                try:
                    client.send(TOPIC, [{"body": b"without a quorum"}])
                except EngineError as exc:
                    if exc.code != ErrorCode.BUSY:  # a writer slow on two busy cores: nothing stored, sent again
                        refused = exc
            assert refused.code == ErrorCode.NOT_MASTER, refused
            deadline = time.monotonic() + 15
            shown = control(master.store_dir, StatusQuery())
            while not any(reason.startswith("membership: etcd out of reach") for reason in shown.reasons):
                assert time.monotonic() < deadline, shown.reasons  # said once its requests to every member failed
                time.sleep(0.1)  # polls the supervisor's status: the membership actor is another process
                shown = control(master.store_dir, StatusQuery())
            assert shown.state == "DEGRADED"
            assert client.pull(TOPIC, 0, 0, max_messages=1)["messages"][0]["body"] == b"before"  # reads go on
            for k in lost:
                brokers.etcd.start_member(brokers.etcd.members[k])
            brokers.etcd.wait_ready(30)
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.send(TOPIC, [{"body": b"after"}])
                    break
                except EngineError as exc:
                    assert exc.code in (ErrorCode.NOT_MASTER, ErrorCode.BUSY) and time.monotonic() < deadline, exc
                    time.sleep(0.1)  # the membership actor's next renewal, in another process
        kept = brokers.role(master)
        assert brokers.master() is master
        assert kept is not None and kept.is_master and kept.epoch == role.epoch, (role, kept)


@pytest.mark.timeout(60)
def test_three_members_stop_within_seconds_the_leader_last(tmp_path: Path) -> None:
    """Stopped all at once, the leader hands its leadership to a follower that is stopping too and
    waits etcd's request timeout for it (7.0 s, measured); stopped last, it has no one to hand it to."""
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    etcd = EtcdCluster(tmp_path / "etcd", member_ports(free_port(), 3))
    etcd.start()
    began = time.monotonic()
    etcd.stop()
    assert time.monotonic() - began < 5.0
    assert etcd.pids() == []


@pytest.mark.timeout(60)
def test_a_member_without_a_quorum_is_up_but_not_healthy(tmp_path: Path) -> None:
    """Its ``/health`` answers 503 (``{"health": "false"}``): up, with no leader, not down."""
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    etcd = EtcdCluster(tmp_path / "etcd", member_ports(free_port(), 3))
    etcd.start()
    try:
        # The leader is the one kept: the member that last had a quorum, the slowest to lose it.
        kept = next(k for k, member in enumerate(etcd.members) if member_health(member.client_url).leader)
        for k in range(len(etcd.members)):
            if k != kept:
                etcd.kill_member(k)
        deadline = time.monotonic() + 20
        # A leader answers 503 as soon as a quorum read times out, and steps down (etcd's check quorum)
        # only after its election timeout: the two are seen in either order.
        while not ((health := member_health(etcd.members[kept].client_url)).up
                   and not health.healthy and not health.leader):
            assert time.monotonic() < deadline, health
            time.sleep(0.1)  # polls etcd: it notices the lost quorum after its election timeout
        assert health.reason == ""
        assert not member_health(etcd.members[(kept + 1) % 3].client_url).up
    finally:
        etcd.stop()
