"""Who may do what on the client endpoint (``acl_enabled`` with ``curve_enabled``, docs/security.md):
each request's CURVE key names the user whose policies must allow it. A key the allow-list lets in
but no user has, and a user without the permission (another op, another topic, another group's
offsets, a denied prefix), are refused with stable codes, written to the audit log, and nothing is
stored or changed; a group's offset moved back is audited as a reset; the gRPC endpoint's own key
is trusted (it checks its callers itself); the wire fuzzer's frames are refused, never crash the
front."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
from rocketmq.grpc_protocol import Code

from engine.client import EngineError, StoreClient
from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys, keygen, public_key_of
from engine.logs import LOG_DIR
from engine.security.acl import AclFile, Policy, User, save
from supervisor.launcher import EngineProcess
from tests.grpc.conftest import grpc_config
from tests.grpc.test_grpc_acl import send as grpc_send
from tests.grpc.test_grpc_acl import signed
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(120)

NAMES = ("ops", "orders-service", "analytics", "stranger", "gateway")  # gateway: the gRPC endpoint's own key


@dataclass
class Keys:
    server_public: Path
    secrets: dict[str, Path]

    def curve(self, name: str) -> CurveKeys:
        return CurveKeys.from_files(self.server_public, self.secrets[name])


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProcess, Keys]]:
    root = tmp_path_factory.mktemp("front-acl")
    keys_dir, allowed = root / "keys", root / "allowed"
    allowed.mkdir()
    server_public, server_secret = keygen(keys_dir, "server")
    secrets = {}
    for name in NAMES:  # every key gets in (the allow-list); the ACL decides what each may do
        public, secrets[name] = keygen(keys_dir, name)
        (allowed / f"{name}.key").write_bytes(public.read_bytes())
    users = {name: User(curve_public_key=public_key_of(secrets[name]), super=name == "ops")
             for name in NAMES if name not in ("stranger", "gateway")}
    users["orders-service"] = User(curve_public_key=users["orders-service"].curve_public_key,
                                   access_key="orders-ak", secret_key="orders-sk")
    policies = [Policy(user="orders-service", resource="topic:orders*", actions=["pub"]),
                Policy(user="orders-service", resource="topic:orders-secret", actions=["*"], decision="deny"),
                Policy(user="analytics", resource="topic:orders", actions=["sub"]),
                Policy(user="analytics", resource="group:analytics", actions=["sub"])]
    store = root / "store"
    save(store, AclFile(users=users, policies=policies))
    engine = EngineProcess(store, config=grpc_config(
        curve_enabled=True, curve_server_secret_key_file=str(server_secret), curve_authorized_keys_dir=str(allowed),
        acl_enabled=True, grpc_curve_client_secret_key_file=str(secrets["gateway"])))
    engine.start()
    try:
        yield engine, Keys(server_public, secrets)
    finally:
        engine.stop()


def refused(call: object) -> tuple[ErrorCode, str]:
    assert callable(call)
    with pytest.raises(EngineError) as caught:
        call()
    return ErrorCode(caught.value.code), caught.value.message


def test_each_user_does_what_its_policies_allow_and_nothing_else(setup: tuple[EngineProcess, Keys]) -> None:
    engine, keys = setup
    with StoreClient(engine.endpoint, curve=keys.curve("ops")) as ops:
        ops.create_topic("orders", queue_count=1)
        ops.create_topic("orders-secret", queue_count=1)
    with StoreClient(engine.endpoint, curve=keys.curve("orders-service")) as orders:
        assert orders.send("orders", [{"body": b"o-1"}])[0]["status"] == "PUT_OK"
        assert orders.list_topics()  # any user may list and route
        assert refused(lambda: orders.pull("orders", 0, 0)) == (
            ErrorCode.FORBIDDEN, "user 'orders-service' may not sub on topic:orders (no policy allows it)")
        assert refused(lambda: orders.send("orders-secret", [{"body": b"leak"}]))[0] == ErrorCode.FORBIDDEN
        assert refused(lambda: orders.delete_topic("orders"))[0] == ErrorCode.FORBIDDEN
        assert refused(lambda: orders.create_topic("orders-new", queue_count=1))[0] == ErrorCode.FORBIDDEN
        assert refused(orders.status)[0] == ErrorCode.FORBIDDEN  # admin on the cluster
    with StoreClient(engine.endpoint, curve=keys.curve("ops")) as ops:
        wait_dispatched(ops)  # the send is in its queue (status: admin)
    with StoreClient(engine.endpoint, curve=keys.curve("analytics")) as analytics:
        assert [m["body"] for m in analytics.pull("orders", 0, 0)["messages"]] == [b"o-1"]
        analytics.commit_offset("analytics", "orders", 0, 1)
        analytics.commit_offset("analytics", "orders", 0, 0)  # moved back: a reset, audited
        analytics.commit_offset("analytics", "orders", 0, 1)  # forward again: a consumer's commit, not audited
        assert refused(lambda: analytics.commit_offset("billing", "orders", 0, 0)) == (
            ErrorCode.FORBIDDEN, "user 'analytics' may not sub on group:billing (no policy allows it)")
        assert refused(lambda: analytics.send("orders", [{"body": b"x"}]))[0] == ErrorCode.FORBIDDEN
        assert refused(lambda: analytics.pull("orders-secret", 0, 0))[0] == ErrorCode.FORBIDDEN
    with StoreClient(engine.endpoint, curve=keys.curve("stranger")) as stranger:
        code, message = refused(lambda: stranger.send("orders", [{"body": b"x"}]))
        assert code == ErrorCode.UNAUTHENTICATED and "not a known user" in message
    with StoreClient(engine.endpoint, curve=keys.curve("ops")) as ops:
        wait_dispatched(ops)
        assert ops.queue_stats("orders", 0)["max_offset"] == 1
        assert ops.queue_stats("orders-secret", 0)["max_offset"] == 0
        assert ops.fetch_offset("billing", "orders", 0) == -1  # the refused commit changed nothing
        assert {t["topic"] for t in ops.list_topics()} >= {"orders", "orders-secret"}
    lines = [json.loads(line) for line in (engine.store_dir / LOG_DIR / "audit-front.jsonl").read_text().splitlines()]
    refusals = [line for line in lines if line["event"] == "refused"]
    assert [(line["code"], line["op"]) for line in refusals][:2] == [("FORBIDDEN", "pull"), ("FORBIDDEN", "send")]
    assert [(line["op"], line["resource"], line["subject"]) for line in lines if line["event"] == "admin"][:2] == [
        ("create_topic", "topic:orders", "ops"), ("create_topic", "topic:orders-secret", "ops")], lines
    resets = [line for line in lines if line.get("op") == "offset reset"]
    assert [(r["subject"], r["resource"], r["topic"], r["offset_from"], r["offset_to"]) for r in resets] == [
        ("analytics", "group:analytics", "orders", 1, 0)], resets
    last = lines[-1]
    assert (last["code"], last["op"], last["source"]) == ("UNAUTHENTICATED", "send", "127.0.0.1")
    assert last["subject"] == "key:" + public_key_of(keys.secrets["stranger"]), last


def test_fuzzed_frames_from_a_user_are_refused_and_the_front_keeps_serving(setup: tuple[EngineProcess, Keys]) -> None:
    engine, keys = setup
    rng = random.Random(7)
    context = zmq.Context()
    try:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        keys.curve("analytics").apply(sock)
        sock.connect(engine.endpoint)
        for _ in range(200):  # bounded: garbage, and maps that name ops it may not do
            frame = rng.choice([rng.randbytes(rng.randrange(1, 64)),
                                b"\x83\xa2op\xa4send\xa2id\x01\xa5topic\xa6orders",
                                b"\x82\xa2op\xadcreate_topic\xa5topic\xa1x"])
            sock.send(frame)
        answered = 0
        while sock.poll(2_000):
            sock.recv()
            answered += 1
        assert answered >= 1
    finally:
        context.destroy(linger=0)
    with StoreClient(engine.endpoint, curve=keys.curve("ops")) as ops:  # still serving; nothing stored
        wait_dispatched(ops)
        assert ops.queue_stats("orders", 0)["max_offset"] == 1
        assert "x" not in {t["topic"] for t in ops.list_topics()}


def test_the_grpc_endpoint_s_own_key_is_trusted_its_callers_checked_there(setup: tuple[EngineProcess, Keys]) -> None:
    """The endpoint's key is no user: the front serves it because the endpoint checked its caller."""
    engine, keys = setup
    with StoreClient(engine.endpoint, curve=keys.curve("ops")) as ops:
        wait_dispatched(ops)
        before = ops.queue_stats("orders", 0)["max_offset"]
    assert grpc_send(engine, "orders", signed("orders-ak", "orders-sk")).code == Code.OK
    assert grpc_send(engine, "orders", signed("orders-ak", "wrong")).code == Code.UNAUTHORIZED
    with StoreClient(engine.endpoint, curve=keys.curve("ops")) as ops:
        wait_dispatched(ops)
        assert ops.queue_stats("orders", 0)["max_offset"] == before + 1
