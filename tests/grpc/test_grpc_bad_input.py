"""Bad input on the gRPC port: malformed protobuf, unknown methods, huge messages, garbage that
is not HTTP/2, a flood of streams. Each gets a status; the endpoint never goes down (its pid
stays the same) and the engine behind it keeps serving."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from supervisor.launcher import EngineProcess
from tests.grpc.conftest import grpc_config
from tests.helpers import engine_with_topics

pytestmark = pytest.mark.timeout(120)

SERVICE = "/apache.rocketmq.v2.MessagingService/"
METHODS = ["QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "AckMessage", "ChangeInvisibleDuration",
           "NotifyClientTermination", "EndTransaction", "ForwardMessageToDeadLetterQueue"]
STREAMS_MAX = 16
BODY_MAX = 64 * 1024
TOPIC = "bad-input"
QUIET = "bad-input-quiet"  # never written to


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    config = grpc_config(grpc_streams_max=STREAMS_MAX, message_body_bytes_max=BODY_MAX,
                         grpc_message_bytes_max=BODY_MAX + 64 * 1024)
    with engine_with_topics(tmp_path_factory.mktemp("grpc-bad") / "store", config, {TOPIC: 2, QUIET: 2}) as process:
        yield process


@pytest.fixture
def channel(engine: EngineProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(engine.config.grpc_endpoint) as opened:
        yield opened


def raw_call(channel: grpc.Channel, method: str, payload: bytes) -> grpc.StatusCode:
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def send(channel: grpc.Channel, body: bytes, **system: object) -> service_pb2.SendMessageResponse:
    message = definition_pb2.Message(topic=definition_pb2.Resource(name=TOPIC), body=body,
                                     system_properties=definition_pb2.SystemProperties(**system))
    return MessagingServiceStub(channel).SendMessage(service_pb2.SendMessageRequest(messages=[message]), timeout=10)


def still_serving(engine: EngineProcess, pid: int, channel: grpc.Channel) -> None:
    assert engine.actor_pids()["grpc"] == pid, "the gRPC endpoint was restarted"
    assert send(channel, b"fine", message_id="01AA").status.code == Code.OK


def test_malformed_protobuf_gets_bad_request_on_every_method(engine: EngineProcess, channel: grpc.Channel) -> None:
    pid = engine.actor_pids()["grpc"]
    for method in METHODS:
        call = channel.unary_unary(SERVICE + method, request_serializer=None,
                                   response_deserializer=service_pb2.QueryRouteResponse.FromString)
        for payload in (b"\xff" * 12, b"\x0a\xff\xff\xff\xff\x0f"):
            reply = call(payload, timeout=10)  # every response starts with its status (field 1)
            assert reply.status.code == Code.BAD_REQUEST and "not valid protobuf" in reply.status.message
    receive = channel.unary_stream(SERVICE + "ReceiveMessage", request_serializer=None,
                                   response_deserializer=service_pb2.ReceiveMessageResponse.FromString)
    assert [r.status.code for r in receive(b"\xff" * 12, timeout=10)] == [Code.BAD_REQUEST]
    still_serving(engine, pid, channel)


def test_random_bytes_fuzzing_never_takes_the_endpoint_down(engine: EngineProcess, channel: grpc.Channel) -> None:
    pid = engine.actor_pids()["grpc"]
    rng = random.Random(11)
    for _ in range(300):
        payload = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        raw_call(channel, SERVICE + rng.choice(METHODS), payload)  # any status; never a dead endpoint
    still_serving(engine, pid, channel)


def test_unknown_methods_are_unimplemented(engine: EngineProcess, channel: grpc.Channel) -> None:
    assert raw_call(channel, SERVICE + "NoSuchMethod", b"") == grpc.StatusCode.UNIMPLEMENTED
    assert raw_call(channel, "/some.other.Service/Call", b"") == grpc.StatusCode.UNIMPLEMENTED
    assert raw_call(channel, SERVICE + "PullMessage", b"") == grpc.StatusCode.UNIMPLEMENTED


def test_huge_messages_are_refused_with_a_status(engine: EngineProcess, channel: grpc.Channel) -> None:
    pid = engine.actor_pids()["grpc"]
    assert send(channel, b"x" * (BODY_MAX + 1), message_id="01BB").status.code == Code.MESSAGE_BODY_TOO_LARGE
    assert send(channel, b"", message_id="01BC").status.code == Code.MESSAGE_BODY_EMPTY
    with pytest.raises(grpc.RpcError) as too_big:
        send(channel, b"x" * (BODY_MAX + 128 * 1024), message_id="01BD")
    assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    still_serving(engine, pid, channel)


def test_send_requests_the_engine_cannot_take_get_their_codes(engine: EngineProcess, channel: grpc.Channel) -> None:
    stub = MessagingServiceStub(channel)
    assert stub.SendMessage(service_pb2.SendMessageRequest(), timeout=10).status.code == Code.BAD_REQUEST
    assert send(channel, b"no id").status.code == Code.ILLEGAL_MESSAGE_ID
    assert send(channel, b"bad key", message_id="01CC", keys=["has space"]).status.code == \
        Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    gzip_lie = send(channel, b"not gzip at all", message_id="01CD", body_encoding=definition_pb2.GZIP)
    assert gzip_lie.status.code == Code.MESSAGE_CORRUPTED


def test_garbage_that_is_not_http2_closes_that_connection_only(engine: EngineProcess, channel: grpc.Channel) -> None:
    pid = engine.actor_pids()["grpc"]
    host, port = engine.config.grpc_endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 16)
        raw.settimeout(5)
        try:
            while raw.recv(4096):
                pass
        except (ConnectionResetError, TimeoutError):
            pass
    still_serving(engine, pid, channel)


def test_a_flood_of_streams_past_the_limit_gets_resource_exhausted(engine: EngineProcess,
                                                                    channel: grpc.Channel) -> None:
    pid = engine.actor_pids()["grpc"]
    stub = MessagingServiceStub(channel)
    request = service_pb2.ReceiveMessageRequest(
        group=definition_pb2.Resource(name="flood"),
        message_queue=definition_pb2.MessageQueue(topic=definition_pb2.Resource(name=QUIET)), batch_size=1,
        invisible_duration={"seconds": 10}, long_polling_timeout={"seconds": 2})

    def receive() -> str:
        try:
            return Code.Name(next(iter(stub.ReceiveMessage(request, timeout=10))).status.code)
        except grpc.RpcError as exc:
            return exc.code().name

    with ThreadPoolExecutor(STREAMS_MAX * 3) as pool:
        outcomes = list(pool.map(lambda _: receive(), range(STREAMS_MAX * 3)))
    assert set(outcomes) <= {"MESSAGE_NOT_FOUND", "RESOURCE_EXHAUSTED"}, outcomes
    assert outcomes.count("RESOURCE_EXHAUSTED") >= STREAMS_MAX, outcomes
    assert outcomes.count("MESSAGE_NOT_FOUND") >= 1
    still_serving(engine, pid, channel)
