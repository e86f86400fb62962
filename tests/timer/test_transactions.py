"""Transactional messages against a live engine: half messages, decisions and the check service."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from engine.client import EngineError, StoreClient
from engine.errors import ErrorCode
from supervisor.launcher import EngineProcess
from tests.helpers import engine_with_topics, wait_dispatched
from tests.timer.conftest import TOPIC, timer_config

pytestmark = pytest.mark.timeout(60)
GROUP = "tx-producers"


def half(client: StoreClient, body: bytes, queue_id: int = 0) -> str:
    [result] = client.send(TOPIC, [{"body": body, "keys": [body.decode()]}], queue_id=queue_id, transaction=True,
                           producer_group=GROUP)
    assert result["status"] == "PUT_OK"
    return str(result["msg_id"])


def visible(client: StoreClient, queue_id: int = 0) -> list[bytes]:
    """What consumers see in the queue once everything stored so far is dispatched."""
    wait_dispatched(client)
    return [bytes(m["body"]) for m in client.pull(TOPIC, queue_id, 0, max_messages=1_000)["messages"]]


def test_a_committed_half_becomes_visible_once_and_a_rolled_back_one_never(timed_engine: EngineProcess) -> None:
    with timed_engine.client() as client:
        committed, rolled_back = half(client, b"pay-1"), half(client, b"pay-2")
        assert visible(client) == []
        assert client.commit(committed) == "commit"  # answered once the message is stored
        assert visible(client) == [b"pay-1"]
        message = client.pull(TOPIC, 0, 0)["messages"][0]
        assert message["properties"]["TRAN_MSG"] == "true" and "REAL_TOPIC" not in message["properties"]
        assert client.rollback(rolled_back) == "rollback"
        # the same decision again is answered as before; the other one is refused
        assert client.commit(committed) == "commit"
        assert client.rollback(rolled_back) == "rollback"
        for msg_id, other in ((committed, "rollback"), (rolled_back, "commit")):
            with pytest.raises(EngineError) as refused:
                client.end_transaction(msg_id, other)
            assert refused.value.code == ErrorCode.TRANSACTION_ENDED
        assert visible(client) == [b"pay-1"]


def test_an_undecided_half_is_offered_to_its_producer_group_then_decided_from_the_check(
        timed_engine: EngineProcess) -> None:
    with timed_engine.client() as client:
        msg_id = half(client, b"order-9", queue_id=1)
        assert client.transaction_checks("other-group", max_wait_ms=600) == []
        [check] = client.transaction_checks(GROUP, max_wait_ms=5_000)
        assert (check["msg_id"], check["topic"], check["queue_id"]) == (msg_id, TOPIC, 1)
        assert bytes(check["body"]) == b"order-9" and check["check_times"] >= 1
        assert client.end_transaction(check["msg_id"], "commit", producer_group=GROUP) == "commit"
        assert visible(client, 1) == [b"order-9"]


def rolled_back(engine: EngineProcess) -> int:
    from engine.ipc.control import control
    from engine.ipc.messages import StatusQuery

    actors = control(engine.store_dir, StatusQuery()).actors
    return next(a.detail.get("rolled_back", 0) for a in actors if a.name == "transactions")


def test_a_half_nobody_decides_is_rolled_back_after_the_last_check(store_dir: Path) -> None:
    config = timer_config(transaction_check_max=2)
    with engine_with_topics(store_dir, config, {TOPIC: 1}) as engine, engine.client() as client:
        msg_id = half(client, b"forgotten")
        offered = 0
        end = time.monotonic() + 20
        while rolled_back(engine) == 0:
            assert time.monotonic() < end, "the half was never rolled back"
            offered += len(client.transaction_checks(GROUP, max_wait_ms=300))
        assert offered == 2
        with pytest.raises(EngineError) as refused:
            client.commit(msg_id)
        assert refused.value.code == ErrorCode.TRANSACTION_ENDED
        assert visible(client) == []


@pytest.mark.parametrize(("msg_id", "code"), [
    ("not-an-id", ErrorCode.INVALID_MSG_ID),
    ("7F0000010000DF4D0000000000FFFFFF", ErrorCode.TRANSACTION_NOT_FOUND),
])
def test_end_transaction_of_what_is_not_a_half_is_refused(timed_engine: EngineProcess, msg_id: str,
                                                          code: ErrorCode) -> None:
    with timed_engine.client() as client:
        with pytest.raises(EngineError) as refused:
            client.commit(msg_id)
        assert refused.value.code == code
        plain = client.send(TOPIC, [{"body": b"plain"}], queue_id=0)[0]["msg_id"]
        with pytest.raises(EngineError) as refused:
            client.commit(plain)
        assert refused.value.code == ErrorCode.TRANSACTION_NOT_FOUND
        with pytest.raises(EngineError) as refused:
            client.end_transaction(half(client, b"x"), "commit", producer_group="someone-else")
        assert refused.value.code == ErrorCode.TRANSACTION_NOT_FOUND
        with pytest.raises(EngineError) as refused:
            client.request("end_transaction", msg_id=plain, decision="maybe")
        assert refused.value.code == ErrorCode.INVALID_FIELD
        with pytest.raises(EngineError) as refused:
            client.send(TOPIC, [{"body": b"x"}], transaction=True)
        assert refused.value.code == ErrorCode.INVALID_FIELD


def test_a_committed_record_carries_the_commit_type_and_its_half_offset_as_rocketmq_stores_it(
        timed_engine: EngineProcess) -> None:
    """EndTransactionProcessor stores the commit with SYSFLAG TRANSACTION_COMMIT_TYPE (0x8) and the
    half's commit log offset in PREPARED_TX_OFFSET; the queue and the index still get it."""
    with timed_engine.client() as client:
        client.send(TOPIC, [{"body": b"before"}], queue_id=1)  # the half is not at offset 0
        msg_id = half(client, b"ship-4")
        assert client.commit(msg_id) == "commit"
        assert visible(client) == [b"ship-4"]
        message = client.pull(TOPIC, 0, 0)["messages"][0]
        [by_key] = client.query_by_key(TOPIC, "ship-4")
        assert by_key["commit_log_offset"] == message["commit_log_offset"]
        with pytest.raises(EngineError) as refused:  # a client cannot set it
            client.request("send", topic=TOPIC, queue_id=0, messages=[{"body": b"x"}], committed_half=0)
        assert refused.value.code == ErrorCode.INVALID_FIELD
    half_offset = int(msg_id[16:], 16)
    assert half_offset > 0
    segment_bytes = timed_engine.config.segment_size_bytes
    offset = message["commit_log_offset"]
    segment = timed_engine.store_dir / "commitlog" / f"{offset - offset % segment_bytes:020d}"
    with segment.open("rb") as f:
        f.seek(offset % segment_bytes)
        raw = f.read(84)
    sys_flag, prepared = struct.unpack_from(">i", raw, 36)[0], struct.unpack_from(">q", raw, 76)[0]
    assert (sys_flag & 0xC, prepared) == (0x8, half_offset)
    assert message["sys_flag"] == sys_flag
