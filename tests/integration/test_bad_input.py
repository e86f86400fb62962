"""Bad input against a live engine: a clear error with a stable code, nothing stored, no actor hurt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from engine import codec
from engine.client import EngineError, RequestTimeout, StoreClient
from engine.config import MiB, StoreConfig
from engine.errors import ErrorCode
from engine.ipc.control import control
from engine.ipc.messages import StatusQuery
from engine.ipc.protocol import PROTOCOL_VERSION, SendMessage
from supervisor.launcher import EngineProcess
from tests.conftest import processes_mentioning
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(120)

GOOD = {"body": b"fine", "keys": ["k"], "tags": "t"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One engine for the whole module: bad input must not disturb it, so tests can share it."""
    store = tmp_path_factory.mktemp("bad-input") / "store"
    process = EngineProcess(store, config=StoreConfig.test_min())
    process.start()
    with process.client() as c:
        c.create_topic("good", queue_count=2)
        c.send("good", [GOOD])
    try:
        yield process
    finally:
        process.stop()
    assert not processes_mentioning(str(store))


@pytest.fixture
def client(engine: EngineProcess) -> Iterator[StoreClient]:
    with engine.client(timeout_ms=10_000) as c:
        yield c


def raw_request(client: StoreClient, frame: bytes) -> dict[str, Any]:
    client.send_raw(frame)
    return client.receive_raw()


def expect_error(call, code: ErrorCode) -> EngineError:
    with pytest.raises(EngineError) as info:
        call()
    assert info.value.code == int(code), info.value
    assert info.value.name == code.name
    assert info.value.message
    return info.value


def encode(**fields: Any) -> bytes:
    return msgspec.msgpack.encode({"v": PROTOCOL_VERSION, "id": 5, **fields})


@pytest.mark.parametrize(("frame", "code"), [
    (b"\xc1not msgpack", ErrorCode.MALFORMED_REQUEST),
    (msgspec.msgpack.encode([1, 2, 3]), ErrorCode.MALFORMED_REQUEST),
    (msgspec.msgpack.encode("just a string"), ErrorCode.MALFORMED_REQUEST),
    (b"\xde\xff\xff", ErrorCode.MALFORMED_REQUEST),  # map16 claiming 65535 entries, truncated
    (b"\x91" * 100_000 + b"\x00", ErrorCode.MALFORMED_REQUEST),  # deep nesting
    (encode(op="fly"), ErrorCode.UNKNOWN_OP),
    (encode(op=7), ErrorCode.INVALID_FIELD),
    (msgspec.msgpack.encode({"v": 99, "op": "ping", "id": 5}), ErrorCode.UNSUPPORTED_VERSION),
    (encode(op="send", topic="good"), ErrorCode.INVALID_FIELD),  # no messages
    (encode(op="send", topic="good", messages=[]), ErrorCode.INVALID_FIELD),
    (encode(op="send", topic="good", messages=[{"body": "text, not bin"}]), ErrorCode.INVALID_FIELD),
    (encode(op="send", topic="good", messages=[{"body": b"x", "colour": "red"}]), ErrorCode.INVALID_FIELD),
    (encode(op="send", topic="good", queue_id="zero", messages=[GOOD]), ErrorCode.INVALID_FIELD),
    (encode(op="pull", topic="good", queue_id=0, offset=-1), ErrorCode.INVALID_FIELD),
    (encode(op="pull", topic="good", queue_id=0), ErrorCode.INVALID_FIELD),
    (encode(op="ping", extra=1), ErrorCode.INVALID_FIELD),
    (b"\x83\xa1v\x01\xa2op\xa4ping\xa2id\xa3\xff\xfe\xfd", ErrorCode.INVALID_FIELD),  # id is a str, bad UTF-8
    (b"\x83\xa1v\x01\xa2op\xa4pi\xffg\xa2id\x05", ErrorCode.MALFORMED_REQUEST),  # invalid UTF-8 in op
    (b"\x83\xc4\x01v\x01\xc4\x02op\xa4ping\xc4\x02id\x05", ErrorCode.MALFORMED_REQUEST),  # bin keys, not str
], ids=["not-msgpack", "array", "string", "truncated-map", "deep-nesting", "unknown-op", "op-not-str",
        "version", "missing-messages", "empty-batch", "body-not-bin", "unknown-message-field", "queue-not-int",
        "negative-offset", "missing-offset", "unknown-field", "id-bad-type", "bad-utf8", "bin-keys"])
def test_malformed_requests_get_stable_codes(client: StoreClient, frame: bytes, code: ErrorCode) -> None:
    reply = raw_request(client, frame)
    assert reply["ok"] is False
    assert reply["error"]["code"] == int(code), reply
    assert reply["error"]["name"] == code.name


@pytest.mark.parametrize("topic", ["", "a/b", "x" * 128, "тема", "TBW102", "rmq_sys_x", "a b", "../etc"])
def test_invalid_topic_names_are_refused(client: StoreClient, topic: str) -> None:
    expect_error(lambda: client.send(topic, [GOOD]), ErrorCode.INVALID_TOPIC)
    expect_error(lambda: client.create_topic(topic), ErrorCode.INVALID_TOPIC)


@pytest.mark.parametrize("topic", ["good\n", "named\n", "good\r", "good\x00", "go\nod"])
def test_a_name_with_a_newline_is_refused_on_every_path(engine: EngineProcess, client: StoreClient,
                                                         topic: str) -> None:
    expect_error(lambda: client.send(topic, [GOOD]), ErrorCode.INVALID_TOPIC)
    expect_error(lambda: client.create_topic(topic), ErrorCode.INVALID_TOPIC)
    expect_error(lambda: client.pull(topic, 0, 0), ErrorCode.INVALID_TOPIC)
    expect_error(lambda: client.commit_offset("g", topic, 0, 1), ErrorCode.INVALID_TOPIC)
    expect_error(lambda: client.fetch_offset("g", topic, 0), ErrorCode.INVALID_TOPIC)
    expect_error(lambda: client.query_by_key(topic, "k"), ErrorCode.INVALID_TOPIC)
    expect_error(lambda: client.delete_topic(topic), ErrorCode.INVALID_TOPIC)
    expect_error(lambda: client.commit_offset("g\n", "good", 0, 1), ErrorCode.INVALID_FIELD)
    expect_error(lambda: client.fetch_offset("g\n", "good", 0), ErrorCode.INVALID_FIELD)
    assert [t["topic"] for t in client.list_topics() if t["topic"] != t["topic"].strip()] == []
    wait_dispatched(client)
    queue_root = engine.store_dir / "consumequeue"
    assert [p.name for p in queue_root.iterdir() if p.name != p.name.strip()] == []


def test_longest_valid_topic_name_is_accepted(client: StoreClient) -> None:
    name = "T" * 127
    assert client.send(name, [GOOD])[0]["status"] == "PUT_OK"


def test_body_limit_is_exact(client: StoreClient) -> None:
    assert client.send("good", [{"body": b"b" * (4 * MiB)}])[0]["status"] == "PUT_OK"
    expect_error(lambda: client.send("good", [{"body": b"b" * (4 * MiB + 1)}]), ErrorCode.MESSAGE_ILLEGAL)
    expect_error(lambda: client.send("good", [{"body": b""}]), ErrorCode.MESSAGE_ILLEGAL)


def test_batch_over_the_limit_is_refused_whole(client: StoreClient) -> None:
    before = client.pull("good", 0, 0)["max_offset"]
    batch = [{"body": b"b" * (1 * MiB)} for _ in range(4)] + [{"body": b"c"}]
    expect_error(lambda: client.send("good", batch, queue_id=0), ErrorCode.MESSAGE_ILLEGAL)
    batch = [GOOD, {"body": b"x", "keys": ["has space"]}]
    expect_error(lambda: client.send("good", batch, queue_id=0), ErrorCode.INVALID_PROPERTY)
    assert client.pull("good", 0, 0)["max_offset"] == before


def test_properties_limit_and_separators(client: StoreClient) -> None:
    big = {"p": "v" * 32_767}
    expect_error(lambda: client.send("good", [{"body": b"x", "properties": big}]), ErrorCode.PROPERTIES_SIZE_EXCEEDED)
    fits = {"p": "v" * (32_767 - 20 - len("p\x01\x02") - 60)}
    assert client.send("good", [{"body": b"x", "properties": fits}])[0]["status"] == "PUT_OK"
    for bad in ({"a\x01": "v"}, {"a": "v\x02"}, {"KEYS": "k"}, {"": "v"}):
        expect_error(lambda bad=bad: client.send("good", [{"body": b"x", "properties": bad}]),
                     ErrorCode.INVALID_PROPERTY)
    expect_error(lambda: client.send("good", [{"body": b"x", "tags": "a\x01b"}]), ErrorCode.INVALID_PROPERTY)


def test_unknown_topics_queues_and_ids(client: StoreClient) -> None:
    expect_error(lambda: client.send("good", [GOOD], queue_id=2), ErrorCode.QUEUE_NOT_FOUND)
    expect_error(lambda: client.pull("good", 7, 0), ErrorCode.QUEUE_NOT_FOUND)
    expect_error(lambda: client.pull("nothing-here", 0, 0), ErrorCode.TOPIC_NOT_FOUND)
    expect_error(lambda: client.query_by_key("nothing-here", "k"), ErrorCode.TOPIC_NOT_FOUND)
    expect_error(lambda: client.get_by_id("ZZ"), ErrorCode.INVALID_MSG_ID)
    expect_error(lambda: client.get_by_id("G" * 32), ErrorCode.INVALID_MSG_ID)
    expect_error(lambda: client.get_by_id("7F00000100002A9F00000000FFFFFFFF"), ErrorCode.MESSAGE_NOT_FOUND)
    expect_error(lambda: client.get_by_id("7F00000100002A9F0000000000000001"), ErrorCode.MESSAGE_NOT_FOUND)
    expect_error(lambda: client.create_topic("good", queue_count=1), ErrorCode.INVALID_FIELD)  # cannot shrink
    expect_error(lambda: client.create_topic("huge", queue_count=100_000), ErrorCode.INVALID_FIELD)


def test_oversized_frame_is_dropped_and_the_engine_serves_on(engine: EngineProcess, client: StoreClient) -> None:
    client.send_raw(b"\x00" * (engine.config.client_frame_bytes_max + 1))
    with pytest.raises(RequestTimeout):
        client.receive_raw(timeout_ms=500)
    with engine.client() as fresh:
        assert fresh.ping()


def test_req_socket_framing_works(engine: EngineProcess) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(engine.endpoint)
        sock.send(encode(op="ping"))
        assert sock.poll(10_000)
        reply = msgspec.msgpack.decode(sock.recv())
        assert reply == {"v": PROTOCOL_VERSION, "id": 5, "ok": True, "pong": True}
    finally:
        sock.close()


def test_bad_input_leaves_actors_and_data_untouched(engine: EngineProcess, client: StoreClient) -> None:
    pids = engine.actor_pids()
    before = wait_dispatched(client)
    stored = client.pull("good", 0, 0)["messages"] + client.pull("good", 1, 0)["messages"]
    for frame in (b"\xc1", encode(op="send", topic="good", messages=[{"body": b"x" * (4 * MiB + 1)}]),
                  encode(op="send", topic="a/b", messages=[GOOD]), encode(op="nope"),
                  encode(op="send", topic="good", queue_id=9, messages=[GOOD])):
        assert raw_request(client, frame)["ok"] is False
    assert client.ping()
    after = client.status()["offsets"]
    assert after["confirmed_offset"] == before["confirmed_offset"], "a refused request stored something"
    assert client.pull("good", 0, 0)["messages"] + client.pull("good", 1, 0)["messages"] == stored
    assert engine.actor_pids() == pids, "an actor was restarted"


def test_error_replies_echo_the_request_id_even_when_other_fields_are_broken(client: StoreClient) -> None:
    reply = raw_request(client, msgspec.msgpack.encode({"v": 1, "op": "send", "id": 4242, "topic": 5}))
    assert (reply["id"], reply["ok"], reply["error"]["name"]) == (4242, False, "INVALID_FIELD")


def test_create_topic_is_idempotent_and_never_shrinks(client: StoreClient) -> None:
    assert client.create_topic("two", queue_count=2)["queue_count"] == 2
    assert client.create_topic("two")["queue_count"] == 2
    assert client.create_topic("two", queue_count=3)["queue_count"] == 3


def test_empty_property_values_are_refused(client: StoreClient) -> None:
    expect_error(lambda: client.send("good", [{"body": b"x", "properties": {"a": ""}}]), ErrorCode.INVALID_PROPERTY)


def test_an_overloaded_writer_answers_busy_and_stores_nothing_it_refused(tmp_path: Path) -> None:
    config = StoreConfig.test_min().replace(send_queue_wait_ms_max=20)
    with EngineProcess(tmp_path / "busy", config=config) as busy_engine:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(busy_engine.endpoint)
        batch = [{"body": b"b" * 1000, "keys": [f"k{i}"]} for i in range(200)]
        try:
            # One alone first, stored whatever the machine's load; then all at once: the later ones
            # wait in the writer's queue past send_queue_wait_ms_max.
            sock.send(encode(op="send", topic="busy", queue_id=0, messages=batch))
            assert sock.poll(30_000)
            replies = [msgspec.msgpack.decode(sock.recv())]
            assert replies[0]["ok"], replies[0]
            for _ in range(100):
                sock.send(encode(op="send", topic="busy", queue_id=0, messages=batch))
            while len(replies) < 101:
                assert sock.poll(30_000)
                replies.append(msgspec.msgpack.decode(sock.recv()))
        finally:
            sock.close()
        stored = sum(len(r["results"]) for r in replies if r["ok"])
        busy = [r for r in replies if not r["ok"]]
        assert busy and all(r["error"]["name"] == "BUSY" for r in busy)
        with busy_engine.client() as client:
            wait_dispatched(client)
            assert client.queue_stats("busy", 0)["max_offset"] == stored


NEGATIVE_IDS = ["7F00000100004DF3FFFFFFFFFFFFFFFF", "7F00000100004DF38000000000000000",
                "20010DB800000000000000000000009900002A9F8000000000000000"]  # the last: an IPv6 store host


def test_ids_and_offsets_that_decode_negative_get_their_codes_and_hurt_no_actor(engine: EngineProcess,
                                                                               client: StoreClient) -> None:
    """Every id and offset from a request is range-checked where it is decoded: storage code asserts
    its offsets are not negative, and an assertion there killed the transaction actor."""
    for msg_id in NEGATIVE_IDS:
        for decision in ("commit", "rollback"):
            expect_error(lambda m=msg_id, d=decision: client.end_transaction(m, d), ErrorCode.TRANSACTION_NOT_FOUND)
        expect_error(lambda m=msg_id: client.get_by_id(m), ErrorCode.MESSAGE_NOT_FOUND)
    for offset in (-1, -2 ** 63):
        expect_error(lambda o=offset: client.get_by_offset(o), ErrorCode.INVALID_FIELD)  # the schema: int >= 0
    status = control(engine.store_dir, StatusQuery())
    assert [(a.name, a.restarts) for a in status.actors if a.restarts] == []
    [stored] = client.send("good", [GOOD], queue_id=0)
    assert client.get_by_id(stored["msg_id"])["body"] == GOOD["body"]


def records_of(*messages: SendMessage) -> bytes:
    records, _ = codec.batch_records(list(messages), "AB", 0)
    assert records is not None
    return records


@pytest.mark.parametrize(("fields", "code"), [
    ({"records": records_of(SendMessage(body=b"r")), "delay_ms": 1_000}, ErrorCode.INVALID_FIELD),
    ({"records": records_of(SendMessage(body=b"r")), "transaction": True, "producer_group": "p"},
     ErrorCode.INVALID_FIELD),
    ({"records": records_of(SendMessage(body=b"r")), "messages": [GOOD]}, ErrorCode.INVALID_FIELD),
    ({"records": "text, not bin"}, ErrorCode.INVALID_FIELD),
    ({"records": b""}, ErrorCode.MESSAGE_ILLEGAL),
    ({"records": records_of(SendMessage(body=b"r"))[:-1]}, ErrorCode.MESSAGE_ILLEGAL),
    ({"records": records_of(SendMessage(body=b"r"), SendMessage(body=b"s", properties={"REAL_TOPIC": "other"}))},
     ErrorCode.INVALID_PROPERTY),
    ({"records": records_of(SendMessage(body=b"b" * (4 * MiB + 1)))}, ErrorCode.MESSAGE_ILLEGAL),
], ids=["delayed", "transactional", "and-messages", "not-bin", "empty", "cut-short", "engine-only-property",
        "body-too-large"])
def test_refused_records_store_nothing(client: StoreClient, fields: dict[str, Any], code: ErrorCode) -> None:
    wait_dispatched(client)
    before = client.status()["offsets"]["written_offset"]
    reply = raw_request(client, encode(op="send", topic="good", queue_id=1, **fields))
    assert reply["ok"] is False and reply["error"]["code"] == int(code), reply
    assert client.status()["offsets"]["written_offset"] == before
    assert client.send("good", [GOOD], queue_id=1)[0]["status"] == "PUT_OK"  # and the writer goes on
