"""The timer's and the transaction actor's requests to the front: protocol structs out, typed replies in."""

from __future__ import annotations

import msgspec
import pytest

from engine.actors.base import Clock
from engine.actors.effects import Effects, Tell
from engine.actors.front_requests import FrontRequests, QueueFollower
from engine.errors import ErrorCode
from engine.ipc.protocol import (
    MessageView,
    PullReply,
    SendMessage,
    SendReply,
    SendRequest,
    decode_request,
    encode_error,
    encode_reply,
)

pytestmark = pytest.mark.timeout(10)

MESSAGE = {"topic": "t", "queue_id": 0, "queue_offset": 7, "commit_log_offset": 4096, "store_size": 120,
           "msg_id": "7F00000100002A9F0000000000001000", "body": b"x", "body_crc": 1, "tags": None, "keys": [],
           "uniq_key": None, "properties": {"a": "b"}, "flag": 0, "sys_flag": 0, "born_timestamp": 1,
           "born_host": "127.0.0.1:0", "store_timestamp": 2, "store_host": "127.0.0.1:10911", "reconsume_times": 0}


def sent(out: Effects) -> bytes:
    [effect] = out
    assert isinstance(effect, Tell)
    return effect.payload


def test_a_send_goes_as_a_protocol_request_and_its_reply_comes_back_typed() -> None:
    front, out, got = FrontRequests(Clock()), Effects(), []
    front.send(out, SendRequest(op="send", topic="t", queue_id=1, messages=[SendMessage(body=b"x")]),
               lambda reply, _later: got.append(reply), timeout_ms=1_000)
    request = decode_request("send", sent(out))  # what the front and the writer decode
    assert isinstance(request, SendRequest) and request.id != 0 and request.messages[0].body == b"x"
    front.handle_reply(encode_reply(request.id, results=[{"status": "PUT_OK", "status_code": 0,
                                                           "commit_log_offset": 512, "grown": 1}]), Effects())
    [reply] = got
    assert isinstance(reply, SendReply) and reply.ok and reply.results[0].commit_log_offset == 512
    assert not front


def test_a_refusal_comes_back_with_its_code() -> None:
    front, out, got = FrontRequests(Clock()), Effects(), []
    front.send(out, SendRequest(op="send", topic="t", messages=[SendMessage(body=b"x")]),
               lambda reply, _later: got.append(reply), timeout_ms=1_000)
    request_id = msgspec.msgpack.decode(sent(out))["id"]
    front.handle_reply(encode_error(request_id, ErrorCode.TOPIC_NOT_FOUND, "no such topic"), Effects())
    [reply] = got
    assert reply is not None and not reply.ok and reply.error is not None
    assert reply.error.code == ErrorCode.TOPIC_NOT_FOUND


def test_a_reply_that_does_not_read_as_its_op_s_is_no_reply() -> None:
    """Its outcome is unknown (the timer looks in the log before trying again), and the actor
    does not fail on it."""
    front, out, got = FrontRequests(Clock()), Effects(), []
    front.send(out, SendRequest(op="send", topic="t", messages=[SendMessage(body=b"x")]),
               lambda reply, _later: got.append(reply), timeout_ms=1_000)
    request_id = msgspec.msgpack.decode(sent(out))["id"]
    front.handle_reply(encode_reply(request_id, results="not a list"), Effects())
    assert got == [None]
    assert not front


def test_a_follower_reads_typed_messages_and_ignores_fields_it_does_not_know() -> None:
    front, out, got = FrontRequests(Clock()), Effects(), []
    follower = QueueFollower(front, "t", 7)
    follower.pull(out, lambda messages, _later: got.extend(messages))
    request = msgspec.msgpack.decode(sent(out))
    assert (request["op"], request["topic"], request["offset"]) == ("pull", "t", 7)
    front.handle_reply(encode_reply(request["id"], status="FOUND", status_code=0, next_offset=8, min_offset=0,
                                     max_offset=8, messages=[{**MESSAGE, "a_later_field": [1, 2]}],
                                     another_later_field={"x": 1}), Effects())
    [message] = got
    assert isinstance(message, MessageView) and message.queue_offset == 7 and message.properties == {"a": "b"}
    assert follower.next_offset == 8 and not follower.pulling


def test_an_empty_pull_past_removed_entries_moves_the_follower_on() -> None:
    front, out = FrontRequests(Clock()), Effects()
    follower = QueueFollower(front, "t", 3)
    follower.pull(out, lambda messages, _later: None)
    request_id = msgspec.msgpack.decode(sent(out))["id"]
    front.handle_reply(msgspec.msgpack.encode(PullReply(id=request_id, ok=True, status="OFFSET_TOO_SMALL",
                                                         status_code=9, next_offset=40)), Effects())
    assert follower.next_offset == 40
