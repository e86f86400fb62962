"""The typed producer on a live engine: every field of a message and of a result, batches,
async sends from many threads, and refusals that are never retried."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import zlib

import pytest

from rmqpy import (
    ClientClosed,
    EngineError,
    ErrorCode,
    Message,
    OutgoingMessage,
    Producer,
    PullConsumer,
    PutStatus,
    SendResult,
)
from rmqpy._send import SendOptions, UniqKeys, batch_fields
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(60)


def read_all(endpoint: str, topic: str, count: int, *, group: str = "reader") -> list[Message]:
    """``count`` messages of ``topic`` from the start, waiting for them (long polling, a deadline)."""
    messages: list[Message] = []
    deadline = time.monotonic() + 20
    with PullConsumer(group, topic, endpoint=endpoint, auto_commit=False) as consumer:
        while len(messages) < count:
            assert time.monotonic() < deadline, f"only {len(messages)} of {count} messages came"
            messages += consumer.poll(1_000)
    return messages


def test_every_field_survives_the_round_trip(engine: EngineProcess, endpoint: str) -> None:
    with Producer(endpoint) as producer:
        result = producer.send("orders", b"\x00hello\xff", keys=["order-1", "customer-7"], tags="paid",
                               properties={"region": "eu", "shop": "north"}, flag=-7, born_timestamp=1_700_000_000_123,
                               queue_id=2)
    assert isinstance(result, SendResult)
    assert (result.topic, result.status, result.status_code, result.ok) == ("orders", "PUT_OK", PutStatus.PUT_OK, True)
    assert (result.queue_id, result.queue_offset) == (2, 0)
    assert len(result.msg_id) == 32 and result.uniq_key is not None and len(result.uniq_key) == 32
    [message] = read_all(endpoint, "orders", 1)
    assert message == Message(
        topic="orders", queue_id=2, queue_offset=0, msg_id=result.msg_id, body=b"\x00hello\xff", tags="paid",
        keys=("order-1", "customer-7"), uniq_key=result.uniq_key,
        properties={"region": "eu", "shop": "north", "UNIQ_KEY": result.uniq_key}, flag=-7,
        born_timestamp=1_700_000_000_123, store_timestamp=result.store_timestamp,
        born_host="127.0.0.1:0", store_host=f"127.0.0.1:{engine.port}",
        commit_log_offset=result.commit_log_offset, store_size=message.store_size,
        body_crc=zlib.crc32(b"\x00hello\xff") & 0x7FFFFFFF, sys_flag=0, reconsume_times=0,
        receipt_handle=None, attempt=None)
    assert message.store_size > len(message.body) + len("orders")
    with engine.client() as client:  # the raw client sees the same record
        assert client.get_by_id(result.msg_id)["uniq_key"] == result.uniq_key


def test_a_batch_goes_to_one_queue_at_consecutive_offsets_and_a_sharding_key_keeps_its_queue(endpoint: str) -> None:
    with Producer(endpoint) as producer:
        results = producer.send_batch("orders", [OutgoingMessage(body=b"a", tags="x"), b"b",
                                                 OutgoingMessage(body=b"c", properties={"UNIQ_KEY": "my-own-id"})])
        assert len({r.queue_id for r in results}) == 1
        assert [r.queue_offset for r in results] == [0, 1, 2]
        assert results[2].uniq_key == "my-own-id", "an id the application set is kept"
        keyed = [producer.send("orders", b"%d" % i, sharding_key="customer-7") for i in range(6)]
        assert len({r.queue_id for r in keyed}) == 1
        with pytest.raises(ValueError):
            producer.send_batch("orders", [])
    messages = read_all(endpoint, "orders", 9)
    in_queue = sorted((m for m in messages if m.queue_id == results[0].queue_id), key=lambda m: m.queue_offset)
    assert [m.body for m in in_queue[:3]] == [b"a", b"b", b"c"]


def test_send_async_from_several_threads_stores_each_message_once(endpoint: str) -> None:
    threads_count, per_thread = 8, 50
    futures: list[concurrent.futures.Future[SendResult]] = []
    lock = threading.Lock()
    with Producer(endpoint) as producer:
        def send_many(thread: int) -> None:
            for n in range(per_thread):
                future = producer.send_async("orders", b"%d-%d" % (thread, n), keys=[f"t{thread}"])
                with lock:
                    futures.append(future)

        threads = [threading.Thread(target=send_many, args=(t,)) for t in range(threads_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        producer.flush(30)
        assert all(f.done() for f in futures), "flush waits for every async send"
        results = [f.result() for f in futures]
        also_blocking = producer.send("orders", b"blocking")
    assert len(results) == threads_count * per_thread
    assert len({(r.queue_id, r.queue_offset) for r in [*results, also_blocking]}) == len(results) + 1
    assert len({r.uniq_key for r in results}) == len(results)
    bodies = sorted(m.body for m in read_all(endpoint, "orders", len(results) + 1))
    sent = [b"%d-%d" % (t, n) for t in range(threads_count) for n in range(per_thread)]
    assert bodies == sorted([*sent, b"blocking"])


def test_blocking_sends_may_share_a_producer_between_threads(endpoint: str) -> None:
    with Producer(endpoint) as producer, concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda n: producer.send("jobs", b"%d" % n), range(100)))
    assert len({(r.queue_id, r.queue_offset) for r in results}) == 100


def test_a_delayed_message_arrives_later_under_the_uniq_key_its_result_named(endpoint: str) -> None:
    with Producer(endpoint) as producer:
        sent_at = time.time_ns() // 1_000_000  # whole ms, as the engine reads its clock
        result = producer.send("jobs", b"later", delay_ms=500, queue_id=1)
    [message] = read_all(endpoint, "jobs", 1)
    assert message.uniq_key == result.uniq_key
    assert message.msg_id != result.msg_id, "the delivered record is a new one"
    assert message.store_timestamp >= sent_at + 500
    assert message.queue_id == 1 and "ORIGIN_OFFSET" in message.properties


def test_a_refusal_that_retrying_cannot_cure_is_raised_at_once(endpoint: str) -> None:
    retries: list[int] = []
    with Producer(endpoint, on_retry=lambda error, n, pause: retries.append(error.code)) as producer:
        with pytest.raises(EngineError) as info:
            producer.send("orders", b"x", keys=["two words"])
        assert (info.value.code, info.value.name) == (ErrorCode.INVALID_PROPERTY, "INVALID_PROPERTY")
        with pytest.raises(EngineError) as info:
            producer.send_async("orders", b"x", delay_ms=10 * 24 * 3_600_000).result(10)
        assert info.value.code == ErrorCode.DELAY_ILLEGAL
        with pytest.raises(TypeError):
            producer.send("orders", "text")  # type: ignore[arg-type]
    assert retries == []
    with pytest.raises(ClientClosed):
        producer.send("orders", b"after close")
    with pytest.raises(ClientClosed):
        producer.send_async("orders", b"after close")


def test_a_plain_batch_goes_as_records_and_the_rest_as_messages() -> None:
    uniq_keys = UniqKeys()
    plain = [OutgoingMessage(body=b"a", tags="t", born_timestamp=5), OutgoingMessage(body=b"b", born_timestamp=5)]
    fields, ids = batch_fields(plain, uniq_keys, SendOptions())
    assert set(fields) == {"records", "born_timestamp"} and fields["born_timestamp"] == 5
    assert len(set(ids)) == 2 and all(isinstance(i, str) and len(i) == 32 for i in ids)
    for messages, options in (
            (plain, SendOptions(delay_ms=1_000)),  # a delay goes through the engine's timer topic
            ([*plain, OutgoingMessage(body=b"c")], SendOptions()),  # born at different times
            ([OutgoingMessage(body=b"d", properties={"bad": "x\x01y"})], SendOptions())):  # the engine says why
        fields, ids = batch_fields(messages, uniq_keys, options)
        assert set(fields) == {"messages"} and len(ids) == len(messages)
