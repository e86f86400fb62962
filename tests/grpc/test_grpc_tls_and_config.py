"""The gRPC endpoint's settings: TLS (the official client sends over it; plaintext gets nothing),
and the rules the config enforces before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from engine.config import ConfigError, StoreConfig
from supervisor.launcher import EngineProcess
from tests.grpc.conftest import grpc_config

pytestmark = pytest.mark.timeout(120)

SEND_OVER_TLS = """
import sys
from rocketmq import ClientConfiguration, Credentials, Message, Producer
config = ClientConfiguration(sys.argv[1], Credentials(), request_timeout=10)
producer = Producer(config, ("tls-topic",), tls_enable=True)
producer.startup()
m = Message()
m.topic, m.body = "tls-topic", b"secret"
print(producer.send(m).message_id)
producer.shutdown()
"""


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "grpc.crt", directory / "grpc.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_with_tls_the_official_client_sends_and_plaintext_gets_nothing(store_dir: Path, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    config = grpc_config(grpc_tls_cert_file=str(cert), grpc_tls_key_file=str(key))
    with EngineProcess(store_dir, config=config) as engine:
        endpoint = engine.config.grpc_endpoint
        sent = subprocess.run([sys.executable, "-c", SEND_OVER_TLS, endpoint], capture_output=True, timeout=60,
                              env={**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cert)}, check=False)
        assert sent.returncode == 0, sent.stderr.decode()[-2000:]
        message_id = sent.stdout.decode().split()[-1]
        with engine.client() as client:
            assert [m["body"] for m in client.query_by_key("tls-topic", message_id)] == [b"secret"]
        request = service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="tls-topic"))
        with grpc.secure_channel(endpoint, grpc.ssl_channel_credentials(cert.read_bytes())) as channel:
            assert MessagingServiceStub(channel).QueryRoute(request, timeout=10).status.code == Code.OK
        with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as plaintext:
            MessagingServiceStub(channel).QueryRoute(request, timeout=3)
        assert plaintext.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@pytest.mark.parametrize(("changes", "complaint"), [
    ({"grpc_endpoint": "0.0.0.0:8081"}, "not a loopback address"),
    ({"grpc_endpoint": "localhost"}, "must be host:port"),
    ({"grpc_tls_cert_file": "/x.crt"}, "go together"),
    ({"grpc_tls_client_ca_file": "/ca.crt"}, "grpc_tls_client_ca_file needs grpc_tls_cert_file"),
    ({"curve_enabled": True, "curve_server_secret_key_file": "/k", "curve_authorized_keys_dir": "/d"},
     "needs grpc_curve_client_secret_key_file"),
    ({"grpc_streams_max": 0}, r"grpc_streams_max must be positive \(got 0\)"),
    ({"grpc_retry_delays_ms": ()}, "needs at least one delay"),
])
def test_the_config_refuses_what_would_not_work(changes: dict, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        StoreConfig(grpc_enabled=True, **changes).validate()


def test_a_non_loopback_grpc_endpoint_is_allowed_with_bind_non_loopback() -> None:
    StoreConfig(grpc_enabled=True, grpc_endpoint="0.0.0.0:8081", bind_non_loopback=True).validate()
