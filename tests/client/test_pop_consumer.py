"""The pop consumer on a live engine: typed pops, acks, nacks and redelivery, changes of
invisible time, stale handles, dead letters, and workers sharing a group."""

from __future__ import annotations

import threading
import time

import pytest

from rmqpy import EngineError, ErrorCode, Message, PopConsumer, Producer, PullConsumer

pytestmark = pytest.mark.timeout(60)


def pop_until(consumer: PopConsumer, count: int, *, deadline_s: float = 20, **kwargs: int) -> list[Message]:
    popped: list[Message] = []
    deadline = time.monotonic() + deadline_s
    while len(popped) < count:
        assert time.monotonic() < deadline, f"only {len(popped)} of {count} popped"
        popped += consumer.pop(count - len(popped), timeout_ms=1_000, **kwargs)
    return popped


def test_ack_ends_a_message_and_nack_brings_it_back_with_the_next_attempt(endpoint: str) -> None:
    with Producer(endpoint) as producer:
        sent = [producer.send("jobs", b"job-%d" % n, queue_id=0, tags="work") for n in range(3)]
    with PopConsumer("workers", "jobs", endpoint=endpoint, invisible_ms=60_000) as consumer:
        first = pop_until(consumer, 3)
        assert [m.body for m in first] == [b"job-0", b"job-1", b"job-2"]
        assert [(m.attempt, m.uniq_key) for m in first] == [(1, r.uniq_key) for r in sent]
        assert all(m.receipt_handle and m.tags == "work" for m in first)
        consumer.ack(first[0])
        consumer.nack(first[1])
        held = consumer.change_invisible_duration(first[2], 60_000)
        assert held.receipt_handle != first[2].receipt_handle and held.body == first[2].body
        [again] = pop_until(consumer, 1)
        assert (again.body, again.attempt) == (b"job-1", 2)
        with pytest.raises(EngineError) as info:
            consumer.ack(first[1])
        assert info.value.code == ErrorCode.INVALID_RECEIPT_HANDLE, "the handle of the first delivery is stale"
        assert consumer.ack_all([again, held]) == []
        assert consumer.pop(timeout_ms=1_500) == [], "everything is done"
        with pytest.raises(ValueError):
            consumer.ack(Message(topic="jobs", queue_id=0, queue_offset=0, msg_id="0" * 32, body=b"x",
                                 born_timestamp=0, store_timestamp=0, commit_log_offset=0, store_size=1))


def test_a_dead_lettered_message_goes_to_the_groups_dlq_with_its_origin(endpoint: str) -> None:
    with Producer(endpoint) as producer:
        producer.send("jobs", b"poison", keys=["job-9"])
    with PopConsumer("workers", "jobs", endpoint=endpoint) as consumer:
        [message] = pop_until(consumer, 1)
        consumer.dead_letter(message)
    with PullConsumer("inspect", "%DLQ%workers", endpoint=endpoint, idle_timeout_ms=2_000) as dlq:
        [dead] = list(dlq)
    assert (dead.body, dead.keys, dead.uniq_key) == (b"poison", ("job-9",), message.uniq_key)
    assert dead.properties["DLQ_ORIGIN_TOPIC"] == "jobs"


def test_workers_of_one_group_share_the_messages_and_each_is_acked_once(endpoint: str) -> None:
    total = 200
    with Producer(endpoint) as producer:
        for start in range(0, total, 50):
            producer.send_batch("jobs", [b"%d" % n for n in range(start, start + 50)])
    acked: list[list[bytes]] = [[], [], []]

    def work(index: int) -> None:
        with PopConsumer("pool", "jobs", endpoint=endpoint, batch_size=8, idle_timeout_ms=1_500) as consumer:
            for message in consumer:
                consumer.ack(message)
                acked[index].append(message.body)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(40)
    everything = [body for bodies in acked for body in bodies]
    assert sorted(everything) == sorted(b"%d" % n for n in range(total)), "each message once, none lost"


def test_messages_popped_but_not_handed_out_come_back_when_the_consumer_closes(endpoint: str) -> None:
    with Producer(endpoint) as producer:
        producer.send_batch("jobs", [b"a", b"b", b"c"], queue_id=1)
    with PopConsumer("workers", "jobs", endpoint=endpoint, batch_size=3, invisible_ms=60_000) as consumer:
        first = next(iter(consumer))  # pops all three, hands out one
        consumer.ack(first)
    with PopConsumer("workers", "jobs", endpoint=endpoint) as consumer:
        back = pop_until(consumer, 2)
    assert sorted(m.body for m in back) == sorted({b"a", b"b", b"c"} - {first.body})
    assert {m.attempt for m in back} == {2}, "given back at close, not after 60 s"
