"""The replication channel under the broker set's key (``replication_curve_secret_key_file``,
docs/security.md): a set whose engines hold it replicates as before, encrypted; an engine without
the key, or with another one, gets no byte of the master's log as a replica (a peer that knows the
set's public key but not its secret is refused and logged), and a replica that
holds the key follows no master that cannot prove it (a fake master)."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest
import zmq

from engine.config import StoreConfig
from engine.ipc.curve import CurveKeys, keygen, public_key_of
from engine.security.acl import ACL_FILE, AclFile, User, load, save
from harness.replication import offsets, replicated_pair, wait_replicated
from supervisor.launcher import EngineProcess, free_port

pytestmark = pytest.mark.timeout(180)


def send(engine: EngineProcess, body: bytes) -> None:
    with engine.client() as client:
        assert client.send("secrets", [{"body": body}])[0]["status"] == "PUT_OK"


def written(engine: EngineProcess) -> int:
    with engine.client() as client:
        return offsets(client)["written_offset"]


def test_the_set_s_key_holders_replicate_and_an_engine_without_it_gets_nothing(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    set_public, set_secret = keygen(keys, "broker-a")
    _public, other_secret = keygen(keys, "stranger")
    config = StoreConfig.test_min().replace(replication_curve_secret_key_file=str(set_secret))
    users = AclFile(users={"ops": User(access_key="ops", secret_key="ops-secret", super=True)})
    save(tmp_path / "set" / "master", users)  # the set's users: shipped, encrypted, to its replicas
    with replicated_pair(tmp_path / "set", config) as (master, replica):
        with master.client() as client:
            client.create_topic("secrets", queue_count=1)
        send(master, b"the first")
        with master.client() as m, replica.client() as r:
            wait_replicated(m, r)
        shipped = replica.store_dir / ACL_FILE
        deadline = time.monotonic() + 30
        while not shipped.exists():  # every replication_config_interval_ms
            assert time.monotonic() < deadline, "the master's ACL never reached its replica"
        assert stat.S_IMODE(shipped.stat().st_mode) == 0o600 and load(replica.store_dir).file == users
        strangers = [EngineProcess(tmp_path / name, config=StoreConfig.test_min().replace(
            replica_of=master.config.replication_endpoint, replication_curve_secret_key_file=key))
            for name, key in (("no-key", ""), ("another-key", str(other_secret)))]
        for stranger in strangers:
            stranger.start()
        try:
            send(master, b"the second")
            with master.client() as m, replica.client() as r:
                end = wait_replicated(m, r)  # the set's replica has it all: the master shipped
            assert end > 0
            assert [written(stranger) for stranger in strangers] == [0, 0]  # not a byte to the others
            assert not any((stranger.store_dir / ACL_FILE).exists() for stranger in strangers)
            # A stolen public key: the set's key as the server's, a key pair of its own to prove
            stolen = zmq.Context()
            try:
                sock = stolen.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                CurveKeys.from_files(set_public, other_secret).apply(sock)
                sock.connect(master.config.replication_endpoint)
                sock.send(b"any follow")
                assert not sock.poll(1_000)  # nothing comes back: the handshake was refused
            finally:
                stolen.destroy(linger=0)
            sender_log = master.store_dir / "logs" / "replication-sender.log"
            deadline = time.monotonic() + 10
            while f"CURVE key {public_key_of(other_secret)} is not" not in sender_log.read_text():
                assert time.monotonic() < deadline, "the refusal was not logged"
        finally:
            for stranger in strangers:
                stranger.stop()


def test_a_replica_holding_the_key_follows_no_master_without_it(tmp_path: Path) -> None:
    _public, set_secret = keygen(tmp_path / "keys", "broker-a")
    with replicated_pair(tmp_path / "plain", StoreConfig.test_min()) as (fake_master, plain_replica):
        with fake_master.client() as client:
            client.create_topic("secrets", queue_count=1)
        keyed = EngineProcess(tmp_path / "keyed", config=StoreConfig.test_min().replace(
            replica_of=fake_master.config.replication_endpoint, replication_curve_secret_key_file=str(set_secret)))
        keyed.start()
        try:
            send(fake_master, b"from a master that holds no key")
            with fake_master.client() as m, plain_replica.client() as r:
                assert wait_replicated(m, r) > 0  # it ships to whoever follows it without a key
            assert written(keyed) == 0
        finally:
            keyed.stop()


def test_each_member_its_own_key_the_members_let_in_each_other_and_nobody_else(tmp_path: Path) -> None:
    """``replication_curve_authorized_keys_dir``: each engine its own key pair; the set's members'
    public keys, ``member-<broker_id>.key``. The master lets in its members' keys only; a replica
    follows its master if the master proves the key of the member it is (``replica_of_broker_id``)."""
    members, own = tmp_path / "members", tmp_path / "own"
    secrets = {}
    for broker_id in (0, 1):
        public, secrets[broker_id] = keygen(own / str(broker_id), "replication")
        members.mkdir(exist_ok=True)
        (members / f"member-{broker_id}.key").write_bytes(public.read_bytes())
    _stranger_public, stranger_secret = keygen(own / "stranger", "replication")
    endpoint = f"tcp://127.0.0.1:{free_port()}"

    def engine(name: str, secret: Path, **settings: object) -> EngineProcess:
        return EngineProcess(tmp_path / name, config=StoreConfig.test_min().replace(
            replication_curve_authorized_keys_dir=str(members), replication_curve_secret_key_file=str(secret),
            **settings))

    master = engine("master", secrets[0], replication_endpoint=endpoint)
    replica = engine("replica", secrets[1], broker_id=1, replica_of=endpoint, replica_of_broker_id=0)
    # A stranger with a key of its own (not a member's); a member that takes the other member for its master
    stranger = engine("stranger", stranger_secret, broker_id=2, replica_of=endpoint, replica_of_broker_id=0)
    misled = engine("misled", secrets[1], broker_id=1, replica_of=endpoint, replica_of_broker_id=1)
    engines = [master, replica, stranger, misled]
    try:
        for engine in engines:
            engine.start()
        with master.client() as client:
            client.create_topic("secrets", queue_count=1)
        send(master, b"between members")
        with master.client() as m, replica.client() as r:
            assert wait_replicated(m, r) > 0
        assert [written(stranger), written(misled)] == [0, 0]
        sender_log = master.store_dir / "logs" / "replication-sender.log"
        deadline = time.monotonic() + 10
        while f"CURVE key {public_key_of(stranger_secret)} is not a member's" not in sender_log.read_text():
            assert time.monotonic() < deadline, "the stranger's refusal was not logged"
            time.sleep(0.05)
    finally:
        for engine in reversed(engines):
            engine.stop()
