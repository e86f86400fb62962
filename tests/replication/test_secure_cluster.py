"""``cluster start``, secure unless told ``--insecure`` (docs/security.md, "A secure cluster on one
machine"): a CA made with
``cryptography``, etcd over TLS with client certificates and its own users (each limited to the
cluster's keys), CURVE and users on the client ports, an admin user whose secrets only its owner
can read, each engine its own replication key. Then, on that cluster: a client without a key, or
with a key the engines do not know, gets no reply; a user added and granted through etcd (``rmqpy
acl --cluster``) reaches every engine of the set and its audit log; etcd refuses whoever shows no
certificate the CA signed, no etcd user, or a wrong password, and an engine's user anything
outside the cluster's keys; a failover keeps all of it."""

from __future__ import annotations

import getpass
import json
import shutil
import ssl
import stat
import subprocess
import sys
from pathlib import Path
from urllib.error import URLError
from urllib.request import Request, urlopen

import psutil
import pytest

from engine.client import ClientError, EngineError, StoreClient
from engine.coordination.broker_set import BrokerSetKeys
from engine.coordination.etcd import Etcd, EtcdLogin, EtcdRefused, EtcdTls
from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys, keygen, public_key_of
from engine.logs import LOG_DIR
from engine.security.acl import load
from harness.replication import wait_replicated
from rmqpy import Producer, PullConsumer
from rmqpy.credentials import Credentials
from rmqpy.raw import SetClient
from supervisor.etcd_server import ETCD
from supervisor.launcher import free_port
from tests.helpers import require, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # etcd and two engines, one failover: about 25 s


def run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=90,
                          check=False)



def private_files(root: Path) -> list[Path]:
    """Every file that holds a secret: PEM private keys, CURVE secret keys, the admin's credentials."""
    return [path for path in root.rglob("*") if path.is_file() and (
        b"PRIVATE KEY" in path.read_bytes() or path.name.endswith((".key_secret", "password")) or
        path.name == "admin.json")]


def test_a_secure_cluster_keeps_strangers_out_and_takes_users_from_etcd(tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    port, etcd_port = free_port(), free_port()
    directory = tmp_path / "cluster"
    started = run("supervisor", "cluster", "start", "--dir", str(directory), "--etcd", "--replicas", "1",
                  "--etcd-members", "1", "--port", str(port), "--etcd-port", str(etcd_port))
    cluster = json.loads((directory / "cluster.json").read_text()) if (directory / "cluster.json").exists() else {}
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        secrets_dir = directory / "secrets"
        assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
        assert len(private_files(secrets_dir)) == 14  # 5 PEM keys, 4 CURVE secrets, admin.json, 4 etcd passwords
        assert {stat.S_IMODE(path.stat().st_mode) for path in private_files(secrets_dir)} == {0o600}
        assert not list((secrets_dir / "clients").glob("*.key_secret"))  # the allow-list holds public keys only
        admin = json.loads((secrets_dir / "admin.json").read_text())
        engines_key = secrets_dir / "engines.key"
        address = f"tcp://127.0.0.1:{port},tcp://127.0.0.1:{port + 10}"

        def client(secret: Path) -> SetClient:
            return SetClient(address, curve=CurveKeys.from_files(engines_key, secret))

        def master_client(secret: Path, timeout_ms: int) -> StoreClient:
            return StoreClient(f"tcp://127.0.0.1:{port}", timeout_ms=timeout_ms,
                               curve=CurveKeys.from_files(engines_key, secret))

        with client(Path(admin["curve_secret_key_file"])) as as_admin:
            as_admin.create_topic("orders", queue_count=2)
            assert as_admin.send("orders", [{"body": b"first"}])[0]["status"] == "PUT_OK"

        # rmqpy with the admin's credentials: the routes from etcd over TLS as its user, the sets under CURVE
        credentials = Credentials.load(secrets_dir / "admin.json")
        etcd_url = f"https://127.0.0.1:{etcd_port}"

        def routed() -> bool:  # the set's master publishes its topics in etcd within a refresh
            with credentials.cluster(etcd_url) as cluster:
                try:
                    return bool(cluster.route("orders", fresh=True).brokers)
                except EngineError:
                    return False

        wait_until("the topic's route never reached etcd", routed)
        with Producer(cluster=credentials.cluster(etcd_url), curve=credentials.curve) as producer:
            producer.send("orders", b"through the cluster's routes")
        with PullConsumer("billing", "orders", cluster=credentials.cluster(etcd_url), curve=credentials.curve,
                          idle_timeout_ms=2_000) as consumer:
            assert {m.body for m in consumer} == {b"first", b"through the cluster's routes"}

        # No key, a key of its own: the handshake is refused, nothing comes back
        with StoreClient(f"tcp://127.0.0.1:{port}", timeout_ms=1_000) as plain, pytest.raises(ClientError):
            plain.send("orders", [{"body": b"no key"}])
        _public, stranger_secret = keygen(tmp_path / "keys", "stranger")
        with master_client(stranger_secret, 1_000) as stranger, pytest.raises(ClientError):
            stranger.send("orders", [{"body": b"a stranger's key"}])

        # A user added through etcd: let in by the allow-list, known and limited by the cluster's ACL
        reader_public, reader_secret = keygen(tmp_path / "keys", "reader")
        shutil.copyfile(reader_public, secrets_dir / "clients" / "reader.key")
        etcd_options = ["--cluster", f"https://127.0.0.1:{etcd_port}", "--etcd-ca-file", str(secrets_dir / "ca.pem"),
                        "--etcd-cert-file", str(secrets_dir / "operator-etcd.pem"),
                        "--etcd-key-file", str(secrets_dir / "operator-etcd.key"), "--etcd-user", "operator",
                        "--etcd-password-file", str(secrets_dir / "operator-etcd-password")]
        from_file = ["--credentials", str(secrets_dir / "admin.json")]  # the same, from the admin's file
        grant = ["policy", "grant", "reader", "topic:orders", "sub"]
        for change, options in ((["user", "add", "reader", "--curve-public-key", public_key_of(reader_public)],
                                 etcd_options), (grant, [*etcd_options[:2], *from_file])):
            changed = run("engine", "acl", *change, *options)
            assert changed.returncode == 0, changed.stderr

        def reader_forbidden() -> bool:
            with master_client(reader_secret, 2_000) as reader:
                try:
                    reader.send("orders", [{"body": b"a reader's send"}])
                except EngineError as exc:
                    return exc.code == ErrorCode.FORBIDDEN  # known (not UNAUTHENTICATED), not allowed to send
                except ClientError:
                    return False  # the allow-list not read again yet
            raise AssertionError("a user allowed sub only stored a message")

        wait_until("the user added in etcd never reached the master", reader_forbidden)
        expected = [("acl made by cluster start (cluster, etcd)", "user:admin", getpass.getuser()),
                    ("acl user add (cluster, etcd)", "user:reader", getpass.getuser()),
                    ("acl policy grant (cluster, etcd)", "topic:orders", getpass.getuser())]
        for engine in ("broker-0", "broker-1"):  # each change, with who made it, in each engine's audit log
            audit_file = directory / engine / LOG_DIR / "audit-membership.jsonl"

            def written(path: Path = audit_file) -> bool:
                return path.exists() and len(path.read_text().splitlines()) >= 3

            wait_until(f"{engine} never wrote the cluster's ACL changes to its audit log", written)
            audit = [json.loads(line) for line in audit_file.read_text().splitlines()]
            assert [(line["op"], line["resource"], line["subject"]) for line in audit] == expected, audit
            assert "reader" in load(directory / engine).file.users  # type: ignore[union-attr]

        # etcd: nothing without a certificate the CA signed
        with pytest.raises((URLError, ConnectionError)):  # plain http to a TLS port: the connection is dropped
            urlopen(Request(f"http://127.0.0.1:{etcd_port}/v3/kv/range", data=b'{"key":"Lw=="}'), timeout=5)
        with pytest.raises((URLError, ssl.SSLError, ConnectionError)):
            urlopen(Request(f"https://127.0.0.1:{etcd_port}/v3/kv/range", data=b'{"key":"Lw=="}'), timeout=5,
                    context=ssl.create_default_context(cafile=str(secrets_dir / "ca.pem")))
        operator, url = EtcdTls(**cluster["etcd_tls"]), [f"https://127.0.0.1:{etcd_port}"]
        master_key = BrokerSetKeys("DefaultCluster", "broker-a").master
        with pytest.raises(EtcdRefused, match="user name is empty"):  # a certificate, but no etcd user
            Etcd(url, timeout_ms=3_000, tls=operator).get(master_key)
        with pytest.raises(EtcdRefused, match="authentication failed"):
            wrong = tmp_path / "wrong-password"
            wrong.write_text("guessed\n")
            Etcd(url, timeout_ms=3_000, tls=operator, login=EtcdLogin("broker-1", str(wrong))).get(master_key)
        as_engine = Etcd(url, timeout_ms=3_000, tls=operator,
                         login=EtcdLogin("broker-1", str(secrets_dir / "broker-1" / "etcd-password")))
        entry = as_engine.get(master_key)
        assert entry is not None and entry.value["broker_id"] == 0
        with pytest.raises(EtcdRefused, match="permission denied"):  # the engines' role: the cluster's keys only
            as_engine.put("/elsewhere/key", "an engine's write outside the cluster's keys")
        with pytest.raises(EtcdRefused, match="permission denied"):
            as_engine.request("/auth/user/add", {"name": "intruder", "password": "x"})
        assert Etcd(url, timeout_ms=3_000, tls=operator, login=EtcdLogin(**cluster["etcd_login"])).get(master_key)
        status = run("supervisor", "cluster", "status", "--dir", str(directory))
        assert "leader" in status.stdout.splitlines()[-1], status.stdout

        # A failover: the replica, under its own replication key, becomes master and serves the admin
        stopped = run("supervisor", "cluster", "stop-engine", "broker-0", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr
        with client(Path(admin["curve_secret_key_file"])) as as_admin:
            assert as_admin.send("orders", [{"body": b"after the failover"}])[0]["status"] == "PUT_OK"
            assert as_admin.status()["offsets"]["written_offset"] > 0
        with PullConsumer("after-the-failover", "orders", cluster=credentials.cluster(etcd_url),
                          curve=credentials.curve, idle_timeout_ms=2_000) as consumer:
            bodies = sorted(m.body for m in consumer)  # every acknowledged send, once, on the new master
        assert bodies == [b"after the failover", b"first", b"through the cluster's routes"], bodies
        rejoined = run("supervisor", "cluster", "start-engine", "broker-0", "--dir", str(directory))
        assert rejoined.returncode == 0, rejoined.stderr
    finally:
        stopped_all = run("supervisor", "cluster", "stop", "--dir", str(directory))
    assert stopped_all.returncode == 0, stopped_all.stdout + stopped_all.stderr
    assert not [pid for pid in cluster.get("etcd_pids", []) if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_a_master_and_replicas_without_etcd_are_secure_too(tmp_path: Path) -> None:
    """Fixed roles (no etcd): CURVE and users on the client ports, each engine its own replication
    key; the admin's credentials file is all the command line needs."""
    port = free_port()
    directory = tmp_path / "cluster"
    started = run("supervisor", "cluster", "start", "--dir", str(directory), "--replicas", "1", "--port", str(port))
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        credentials = ["--credentials", str(directory / "secrets" / "admin.json")]
        sent = subprocess.run([sys.executable, "-m", "engine", "produce", "--endpoint", f"tcp://127.0.0.1:{port}",
                               "--topic", "demo", "--count", "3", *credentials], capture_output=True, text=True,
                              timeout=60, check=False)
        assert sent.returncode == 0, sent.stderr
        admin = Credentials.load(directory / "secrets" / "admin.json")
        with StoreClient(f"tcp://127.0.0.1:{port}", curve=admin.curve) as master, \
                StoreClient(f"tcp://127.0.0.1:{port + 10}", curve=admin.curve) as replica:
            wait_replicated(master, replica)  # over the replication channel, under each engine's own key
        with StoreClient(f"tcp://127.0.0.1:{port + 10}", timeout_ms=1_000) as plain, pytest.raises(ClientError):
            plain.status()
    finally:
        stopped = run("supervisor", "cluster", "stop", "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
