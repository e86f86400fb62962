"""etcd's own users (``etcd_user``, ``etcd_password_file``; ``SecureCluster.etcd_users``): once etcd's
auth is on, a client with a certificate but no user is refused, and so is a wrong password; an
engine's user reads and writes the cluster's keys and nothing else; its requests go on after its
member restarts, and a token etcd no longer knows is asked for again; set up twice, the users
are kept, not made again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.coordination.etcd import Etcd, EtcdLogin, EtcdRefused
from supervisor.cluster_secure import SecureCluster
from supervisor.etcd_server import ETCD, EtcdCluster
from supervisor.launcher import free_port
from tests.helpers import require

pytestmark = pytest.mark.timeout(60)


def test_an_engine_s_etcd_user_reaches_its_cluster_s_keys_only_and_logs_in_again(
        tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    secure = SecureCluster(tmp_path)
    secure.create()
    secure.engine_settings("broker-0", "broker-a", 0)
    etcd = EtcdCluster(tmp_path / "etcd", [(free_port(), free_port())], tls=secure.member_tls())
    etcd.start()
    try:
        secure.etcd_users(etcd.endpoints, "DefaultCluster", ["broker-0"])
        secure.etcd_users(etcd.endpoints, "DefaultCluster", ["broker-0"])  # again (a restart): kept
        urls, tls = etcd.endpoints.split(","), secure.operator_tls()
        with pytest.raises(EtcdRefused, match="user name is empty"):
            Etcd(urls, timeout_ms=3_000, tls=tls).get("/rmqpy/DefaultCluster/x")
        engine = Etcd(urls, timeout_ms=3_000, tls=tls,
                      login=EtcdLogin("broker-0", str(secure.root / "broker-0" / "etcd-password")))
        engine.put("/rmqpy/DefaultCluster/broker-a/x", 1)
        engine.put("/rmqpy-routes/DefaultCluster/orders/broker-a", {"queues": 4})
        for outside in ("/rmqpy/OtherCluster/broker-a/x", "/rmqpy-routes/OtherCluster/orders/broker-a", "/x"):
            with pytest.raises(EtcdRefused, match="permission denied"):
                engine.put(outside, 1)
        etcd.kill_member(0)  # a member restarted: the engine's requests go on
        etcd.start_member(etcd.members[0])
        etcd.wait_ready(20.0)
        assert engine.get("/rmqpy/DefaultCluster/broker-a/x") is not None
        engine.token = "unknown.1"  # as one etcd forgot (unused past --auth-token-ttl): asked for again
        entry = engine.get("/rmqpy/DefaultCluster/broker-a/x")
        assert entry is not None and entry.value == 1 and engine.token != "unknown.1"
    finally:
        etcd.stop()
