"""Mutual TLS on the gRPC port (``grpc_tls_client_ca_file``): a client without a certificate the CA
signed gets no connection; with ``acl_enabled`` the certificate's common name is a user
(``tls_common_name``) whose policies decide, as a signature's user would. Certificates made with
openssl here, a CA of the test's own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from engine.security.acl import AclFile, Policy, User, save
from supervisor.launcher import EngineProcess
from tests.grpc.conftest import grpc_config
from tests.helpers import issue_certificate, make_authority, wait_dispatched

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProcess, dict[str, tuple[Path, Path]]]]:
    root = tmp_path_factory.mktemp("mtls")
    ca = make_authority(root)
    server = issue_certificate(root, "localhost", ca, hosts="IP:127.0.0.1,DNS:localhost")
    certs = {"ca": ca, **{name: issue_certificate(root, name, ca) for name in ("orders-service", "stranger")}}
    store = root / "store"
    save(store, AclFile(users={"orders-service": User(tls_common_name="orders-service")},
                        policies=[Policy(user="orders-service", resource="topic:orders", actions=["pub"])]))
    engine = EngineProcess(store, config=grpc_config(
        grpc_tls_cert_file=str(server[0]), grpc_tls_key_file=str(server[1]), grpc_tls_client_ca_file=str(ca[0]),
        acl_enabled=True))
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("orders", queue_count=1)
            client.create_topic("payments", queue_count=1)
        yield engine, certs
    finally:
        engine.stop()


def send(engine: EngineProcess, topic: str, ca: Path, client: tuple[Path, Path] | None) -> definition_pb2.Status:
    credentials = grpc.ssl_channel_credentials(
        ca.read_bytes(), *((client[1].read_bytes(), client[0].read_bytes()) if client else ()))
    request = service_pb2.SendMessageRequest(messages=[definition_pb2.Message(
        topic=definition_pb2.Resource(name=topic), body=b"over mutual TLS",
        system_properties=definition_pb2.SystemProperties(message_id=f"01{time.monotonic_ns():030X}"))])
    with grpc.secure_channel(engine.config.grpc_endpoint, credentials) as channel:
        return MessagingServiceStub(channel).SendMessage(request, timeout=5).status


def test_the_certificate_s_name_is_the_user_and_no_certificate_gets_no_connection(
        setup: tuple[EngineProcess, dict[str, tuple[Path, Path]]]) -> None:
    engine, certs = setup
    ca = certs["ca"][0]
    assert send(engine, "orders", ca, certs["orders-service"]).code == Code.OK
    forbidden = send(engine, "payments", ca, certs["orders-service"])
    assert forbidden.code == Code.FORBIDDEN and "may not pub on topic:payments" in forbidden.message
    stranger = send(engine, "orders", ca, certs["stranger"])  # signed by the CA, no user of the ACL
    assert stranger.code == Code.UNAUTHORIZED, stranger
    with pytest.raises(grpc.RpcError) as refused:
        send(engine, "orders", ca, None)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake asks for a certificate
    with engine.client() as client:
        wait_dispatched(client)
        assert client.queue_stats("payments", 0)["max_offset"] == 0
        assert client.queue_stats("orders", 0)["max_offset"] == 1
