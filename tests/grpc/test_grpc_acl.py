"""Who may do what on the gRPC port (``acl_enabled``, docs/security.md): every call signed as the
official clients sign (AccessKey, SecretKey), the user's policies allowing what it does. A call
with no credentials, a stranger's AccessKey, the wrong secret, a signature replayed past the skew,
or a user without the permission is refused (UNAUTHORIZED, FORBIDDEN), written to the audit log
with its subject and source, and nothing is stored. The official Python client with good and bad
credentials, unchanged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.exception.client_exception import ForbiddenException

from engine.logs import LOG_DIR
from engine.security.acl import AclFile, Policy, User, save
from engine.security.signature import DATE_FORMAT, DATE_HEADER, authorization
from supervisor.launcher import EngineProcess
from tests.grpc.conftest import grpc_config
from tests.grpc.test_official_conformance import EXAMPLES, b64, run_node
from tests.grpc.test_official_python import message
from tests.helpers import require, wait_dispatched

pytestmark = pytest.mark.timeout(120)

ORDERS, SECRET_TOPIC, GROUP = "orders", "orders-secret", "analytics"
USERS = {"orders-service": User(access_key="orders-ak", secret_key="orders-sk"),
         "analytics": User(access_key="analytics-ak", secret_key="analytics-sk"),
         "ops": User(access_key="ops-ak", secret_key="ops-sk", super=True)}
POLICIES = [Policy(user="orders-service", resource="topic:orders*", actions=["pub"]),
            Policy(user="orders-service", resource="topic:orders-secret", actions=["*"], decision="deny"),
            Policy(user="analytics", resource="topic:orders", actions=["sub"]),
            Policy(user="analytics", resource="group:analytics", actions=["sub"])]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    store = tmp_path_factory.mktemp("grpc-acl") / "store"
    save(store, AclFile(users=USERS, policies=POLICIES))
    process = EngineProcess(store, config=grpc_config(acl_enabled=True))
    process.start()
    try:
        with process.client() as client:  # the ZeroMQ port is not checked yet: the operator's way in
            for topic, count in QUEUES.items():
                client.create_topic(topic, queue_count=count)
        yield process
    finally:
        process.stop()


def signed(access_key: str, secret_key: str, *, age_s: float = 0.0) -> list[tuple[str, str]]:
    date = (datetime.now(UTC) - timedelta(seconds=age_s)).strftime(DATE_FORMAT)
    return [(DATE_HEADER, date), ("authorization", authorization(access_key, secret_key, date))]


def send(engine: EngineProcess, topic: str, metadata: list[tuple[str, str]]) -> definition_pb2.Status:
    request = service_pb2.SendMessageRequest(messages=[definition_pb2.Message(
        topic=definition_pb2.Resource(name=topic), body=b"signed",
        system_properties=definition_pb2.SystemProperties(message_id=f"01{time.monotonic_ns():030X}"))])
    with grpc.insecure_channel(engine.config.grpc_endpoint) as channel:
        return MessagingServiceStub(channel).SendMessage(request, metadata=metadata, timeout=10).status


QUEUES = {ORDERS: 2, SECRET_TOPIC: 1}


def stored(engine: EngineProcess, topic: str) -> int:
    with engine.client() as client:
        wait_dispatched(client)  # what was acknowledged is in its queue
        return sum(client.queue_stats(topic, q)["max_offset"] for q in range(QUEUES[topic]))


def audit(engine: EngineProcess) -> list[dict[str, str]]:
    path = engine.store_dir / LOG_DIR / "audit-grpc.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_unsigned_strangers_wrong_secrets_replays_and_missing_permissions_are_refused_and_audited(
        engine: EngineProcess) -> None:
    before = stored(engine, ORDERS), stored(engine, SECRET_TOPIC)
    assert send(engine, ORDERS, signed("orders-ak", "orders-sk")).code == Code.OK
    refused = {
        "no credentials": (send(engine, ORDERS, []), Code.UNAUTHORIZED, "sent no credentials"),
        "a stranger": (send(engine, ORDERS, signed("who-ak", "who-sk")), Code.UNAUTHORIZED, "no user has AccessKey"),
        "the wrong secret": (send(engine, ORDERS, signed("orders-ak", "guess")), Code.UNAUTHORIZED,
                             "is not its SecretKey's"),
        "a replay": (send(engine, ORDERS, signed("orders-ak", "orders-sk", age_s=20 * 60)), Code.UNAUTHORIZED,
                     "from this host's clock"),
        "sub only": (send(engine, ORDERS, signed("analytics-ak", "analytics-sk")), Code.FORBIDDEN,
                     "user 'analytics' may not pub on topic:orders"),
        "denied": (send(engine, SECRET_TOPIC, signed("orders-ak", "orders-sk")), Code.FORBIDDEN,
                   "may not pub on topic:orders-secret (a policy denies it)"),
    }
    for case, (status, code, words) in refused.items():
        assert (status.code, words in status.message) == (code, True), (case, status)
    assert send(engine, SECRET_TOPIC, signed("ops-ak", "ops-sk")).code == Code.OK  # a super user
    assert (stored(engine, ORDERS), stored(engine, SECRET_TOPIC)) == (before[0] + 1, before[1] + 1)
    lines = [line for line in audit(engine) if line["op"] == "SendMessage"][-len(refused):]
    assert [line["code"] for line in lines] == ["UNAUTHENTICATED"] * 4 + ["FORBIDDEN"] * 2, lines
    assert lines[4]["subject"] == "analytics" and lines[4]["resource"] == "topic:orders" \
        and lines[4]["action"] == "pub" and lines[4]["source"] == "127.0.0.1", lines[4]
    assert lines[1]["subject"] == "" and "who-ak" in lines[1]["message"]


def test_the_official_client_sends_and_receives_with_its_user_s_credentials_and_is_refused_without(
        engine: EngineProcess) -> None:
    def configuration(access_key: str, secret_key: str) -> ClientConfiguration:
        return ClientConfiguration(engine.config.grpc_endpoint, Credentials(access_key, secret_key),
                                   request_timeout=10)

    producer = Producer(configuration("orders-ak", "orders-sk"), (ORDERS,))
    producer.startup()
    try:
        receipt = producer.send(message(ORDERS, b"from the orders service"))
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(configuration("analytics-ak", "analytics-sk"), GROUP, {ORDERS: FilterExpression()},
                              await_duration=1)
    consumer.startup()
    try:
        seen: set[str] = set()
        deadline = time.monotonic() + 30
        while receipt.message_id not in seen:  # after what the test before sent to the topic
            assert time.monotonic() < deadline, seen
            for m in consumer.receive(32, 20):
                seen.add(m.message_id)
                consumer.ack(m)
    finally:
        consumer.shutdown()
    stranger = Producer(configuration("analytics-ak", "analytics-sk"), (ORDERS,))
    stranger.startup()
    try:
        with pytest.raises(ForbiddenException, match="40300, FORBIDDEN: user 'analytics' may not pub on topic:orders"):
            stranger.send(message(ORDERS, b"from analytics"))
    finally:
        stranger.shutdown()


def acl_command(engine: EngineProcess, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", "acl", *words, "--store-dir", str(engine.store_dir)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_user_and_a_policy_added_by_the_command_line_apply_without_a_restart_and_a_revoke_too(
        engine: EngineProcess) -> None:
    added = acl_command(engine, "user", "add", "billing", "--access-key", "billing-ak", "--secret-key", "billing-sk")
    assert added.returncode == 0 and "user billing added" in added.stdout, added
    again = acl_command(engine, "user", "add", "billing", "--access-key", "other")
    assert again.returncode == 1 and "exists" in again.stderr, again
    bad = acl_command(engine, "policy", "grant", "billing", "queue:orders", "pub")
    assert bad.returncode == 1 and "use TYPE:NAME" in bad.stderr, bad

    def status_within(code: int, deadline_s: float = 10.0) -> None:
        deadline = time.monotonic() + deadline_s  # the endpoint reads the file again within a second
        while (status := send(engine, ORDERS, signed("billing-ak", "billing-sk"))).code != code:
            assert time.monotonic() < deadline, status

    status_within(Code.FORBIDDEN)  # a known user, with no policy
    granted = acl_command(engine, "policy", "grant", "billing", "topic:orders", "pub,sub")
    assert granted.returncode == 0, granted
    status_within(Code.OK)
    assert acl_command(engine, "policy", "revoke", "billing", "topic:orders").returncode == 0
    status_within(Code.FORBIDDEN)
    assert acl_command(engine, "user", "remove", "billing").returncode == 0
    status_within(Code.UNAUTHORIZED)
    listed = json.loads(acl_command(engine, "user", "list", "--json").stdout)
    assert "billing" not in {row["user"] for row in listed} and all("secret_key" not in row for row in listed)
    cli_audit = [json.loads(line) for line in
                 (engine.store_dir / LOG_DIR / "audit-cli.jsonl").read_text().splitlines()]
    assert [line["op"] for line in cli_audit][-4:] == ["acl user add", "acl policy grant", "acl policy revoke",
                                                       "acl user remove"], cli_audit


def test_the_official_node_client_sends_with_its_user_s_credentials_and_is_refused_with_a_wrong_secret(
        engine: EngineProcess) -> None:
    require(shutil.which("node") is not None, "node")
    require((EXAMPLES / "node_modules" / "rocketmq-client-nodejs").is_dir(), "examples/rocketmq5/node_modules")
    before = stored(engine, ORDERS)

    def node_send(secret_key: str) -> dict[str, object]:
        [result] = run_node(engine.config.grpc_endpoint, [{
            "op": "send", "topic": ORDERS, "catch": True, "messages": [{"body_b64": b64(b"from node")}],
            "credentials": {"access_key": "orders-ak", "secret_key": secret_key}}])
        return result

    assert "receipts" in node_send("orders-sk")
    refused = node_send("guess")
    assert "not its SecretKey's" in str(refused.get("error")), refused
    assert stored(engine, ORDERS) == before + 1
