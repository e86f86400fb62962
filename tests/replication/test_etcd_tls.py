"""etcd over TLS with client certificates (``etcd_tls_*``, docs/security.md): the members serve
their clients and peers over TLS only and ask each for a certificate their CA signed; a broker
set whose engines hold one elects its master and serves; a client without a certificate, or with
one another CA signed, makes no request at all: it cannot take the set's master key or read it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.coordination.broker_set import BrokerSetKeys
from engine.coordination.etcd import Etcd, EtcdTls, EtcdUnavailable
from harness.broker_set import BrokerSet
from supervisor.etcd_server import ETCD, EtcdCluster
from supervisor.launcher import EngineProcess, free_port
from tests.helpers import issue_certificate, make_authority, require

pytestmark = pytest.mark.timeout(180)


def test_a_set_elects_over_tls_and_a_client_without_the_ca_s_certificate_takes_no_master_key(
        tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    certs = tmp_path / "certs"
    ca = make_authority(certs)
    member = issue_certificate(certs, "etcd", ca, hosts="IP:127.0.0.1,DNS:localhost")
    engine_cert = issue_certificate(certs, "broker-a", ca)
    other_ca = make_authority(certs, "other-ca")
    forged = issue_certificate(certs, "forged", other_ca)
    etcd = EtcdCluster(tmp_path / "etcd", [(free_port(), free_port())],
                       tls=EtcdTls(str(ca[0]), str(member[0]), str(member[1])))
    etcd.start()
    engines: list[EngineProcess] = []
    try:
        assert etcd.endpoints.startswith("https://")
        for broker_id in range(2):
            engine = EngineProcess(tmp_path / f"broker-{broker_id}", config=StoreConfig.test_min().replace(
                etcd_endpoints=etcd.endpoints, broker_id=broker_id, broker_name="broker-a",
                replication_endpoint=f"tcp://127.0.0.1:{free_port()}", etcd_tls_ca_file=str(ca[0]),
                etcd_tls_cert_file=str(engine_cert[0]), etcd_tls_key_file=str(engine_cert[1])))
            engine.start()
            engines.append(engine)
        master = BrokerSet(etcd, engines).wait_master()
        with master.client() as client:
            client.create_topic("orders", queue_count=1)
            assert client.send("orders", [{"body": b"elected over TLS"}])[0]["status"] == "PUT_OK"
        keys = BrokerSetKeys(master.config.cluster_name, "broker-a")
        holder = Etcd(etcd.endpoints.split(","), timeout_ms=2_000, tls=EtcdTls(str(ca[0]), *map(str, engine_cert)))
        assert holder.get(keys.master) is not None  # with the CA's certificate: the master key is there
        plain = etcd.endpoints.replace("https://", "http://").split(",")
        strangers = {"no certificate": Etcd(etcd.endpoints.split(","), timeout_ms=2_000),
                     "plain http": Etcd(plain, timeout_ms=2_000),
                     "another CA's certificate": Etcd(etcd.endpoints.split(","), timeout_ms=2_000,
                                                      tls=EtcdTls(str(ca[0]), *map(str, forged)))}
        for who, stranger in strangers.items():
            with pytest.raises(EtcdUnavailable):
                stranger.put(keys.master, {"broker_id": 9, "epoch": 99})
            with pytest.raises(EtcdUnavailable):
                stranger.get(keys.master)
            assert holder.get(keys.master).value.get("broker_id") != 9, who  # type: ignore[union-attr]
    finally:
        for engine in reversed(engines):
            engine.stop()
        etcd.stop()
