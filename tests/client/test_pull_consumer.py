"""The consumer group on a live engine: every queue read fairly, commits, restarts from the
committed offsets, manual commits, exceptions, tag subscriptions and long polling."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from rmqpy import EngineError, ErrorCode, Message, OutgoingMessage, Producer, PullConsumer
from supervisor.launcher import EngineProcess
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(60)


def fill(endpoint: str, topic: str, per_queue: int, queues: int, *, tags: str | None = None) -> list[bytes]:
    """``per_queue`` messages in each queue, bodies ``q<queue>-<n>``; returns the bodies."""
    bodies = []
    with Producer(endpoint) as producer:
        for queue_id in range(queues):
            batch = [OutgoingMessage(body=b"q%d-%d" % (queue_id, n), tags=tags) for n in range(per_queue)]
            producer.send_batch(topic, batch, queue_id=queue_id)
            bodies += [m.body for m in batch]
    return bodies


def take(consumer: PullConsumer, count: int, *, deadline_s: float = 20) -> list[Message]:
    """The next ``count`` messages of the iteration (which waits for them), within a deadline."""
    taken: list[Message] = []
    deadline = time.monotonic() + deadline_s
    for message in consumer:
        taken.append(message)
        if len(taken) == count:
            break
        assert time.monotonic() < deadline, f"only {len(taken)} of {count} came"
    return taken


def test_a_group_reads_every_queue_in_order_and_a_restart_resumes_where_it_committed(
        engine: EngineProcess, endpoint: str) -> None:
    bodies = fill(endpoint, "orders", 50, 4)
    with engine.client() as client:
        wait_dispatched(client)  # every queue has its messages before the group starts
    with PullConsumer("billing", "orders", endpoint=endpoint, commit_every=10) as consumer:
        first = take(consumer, 120)
        for queue_id in range(4):
            offsets = [m.queue_offset for m in first if m.queue_id == queue_id]
            assert offsets == list(range(len(offsets))), "each queue in order, none skipped"
    # leaving the block normally finished the 120th message and committed
    with PullConsumer("billing", "orders", endpoint=endpoint, idle_timeout_ms=1_000) as consumer:
        rest = list(consumer)
    assert sorted(m.body for m in first + rest) == sorted(bodies), "nothing lost, nothing read twice"
    with PullConsumer("billing", "orders", endpoint=endpoint) as consumer:
        assert consumer.positions() == {0: 50, 1: 50, 2: 50, 3: 50}
        assert consumer.lag() == {0: 0, 1: 0, 2: 0, 3: 0}
        assert consumer.poll(0) == []


def test_a_message_on_a_quiet_queue_is_not_held_up_by_a_backlog_on_another(engine: EngineProcess,
                                                                           endpoint: str) -> None:
    backlog = 20_000  # wide enough that the urgent message's path (send, dispatch, wake) is shorter under load
    with Producer(endpoint) as producer:
        for _ in range(backlog // 1_000):
            producer.send_batch("jobs", [b"backlog"] * 1_000, queue_id=0)
        with engine.client() as client:
            wait_dispatched(client)
        handed_out: list[bytes] = []
        deadline = time.monotonic() + 30
        with PullConsumer("fair", "jobs", endpoint=endpoint, auto_commit=False) as consumer:
            for message in consumer:
                handed_out.append(message.body)
                if len(handed_out) == 10:
                    producer.send("jobs", b"urgent", queue_id=1)
                if message.body == b"urgent":
                    break
                assert time.monotonic() < deadline, "the urgent message never came"
    assert handed_out.count(b"backlog") < backlog, "the message on queue 1 waited for queue 0's whole backlog"


def test_without_auto_commit_only_commit_moves_the_group(endpoint: str) -> None:
    fill(endpoint, "jobs", 20, 2)
    options = {"endpoint": endpoint, "queue_ids": [1], "auto_commit": False, "batch_size": 5}
    with PullConsumer("audit", "jobs", **options) as consumer:  # type: ignore[arg-type]
        first = consumer.poll(10_000)
        consumer.commit()
        second = consumer.poll(10_000)
        assert consumer.queue_ids == [1]
    assert [m.queue_offset for m in first + second] == list(range(10))
    with PullConsumer("audit", "jobs", **options) as consumer:  # type: ignore[arg-type]
        assert consumer.positions() == {1: 5}
        again = consumer.poll(10_000)
    assert again == second, "the uncommitted poll is read again, the committed one is not"


def test_a_message_whose_handling_raised_is_read_again(endpoint: str) -> None:
    fill(endpoint, "jobs", 3, 1)
    seen: list[bytes] = []
    with pytest.raises(RuntimeError), PullConsumer("careful", "jobs", endpoint=endpoint, commit_every=1) as consumer:
        for message in consumer:
            seen.append(message.body)
            if message.queue_offset == 1:
                raise RuntimeError("handling failed")
    with PullConsumer("careful", "jobs", endpoint=endpoint, idle_timeout_ms=500) as consumer:
        again = [m.body for m in consumer if m.queue_id == 0]
    assert seen == [b"q0-0", b"q0-1"]
    assert again == [b"q0-1", b"q0-2"], "the failed message comes back, the finished one does not"


def test_a_tag_subscription_delivers_only_its_tags_and_still_moves_past_the_others(endpoint: str) -> None:
    with Producer(endpoint) as producer:
        for n in range(30):
            producer.send("orders", b"%d" % n, tags=("paid", "refunded", "cancelled")[n % 3], queue_id=n % 2)
    with PullConsumer("billing", "orders", endpoint=endpoint, subscription="paid || refunded",
                      idle_timeout_ms=1_000) as consumer:
        got = list(consumer)
    assert Counter(m.tags for m in got) == {"paid": 10, "refunded": 10}
    with PullConsumer("cancels", "orders", endpoint=endpoint, subscription=["cancelled"],
                      idle_timeout_ms=1_000) as consumer:
        assert sorted(int(m.body) for m in consumer) == list(range(2, 30, 3))


def test_a_tag_subscription_commits_past_the_messages_it_filtered_out(engine: EngineProcess, endpoint: str) -> None:
    paid = [OutgoingMessage(body=b"paid-%d" % n, tags="paid") for n in range(10)]
    shipped = [OutgoingMessage(body=b"shipped-%d" % n, tags="shipped") for n in range(40)]
    with Producer(endpoint) as producer:
        producer.send_batch("jobs", paid + shipped, queue_id=0)  # a tail of 40 the group filters out
        producer.send_batch("jobs", shipped[:5], queue_id=1)  # nothing the group takes
    with engine.client() as client:
        wait_dispatched(client)
        # idle_timeout_ms well below max_wait_ms: the lag must not wait for a parked pull's deadline
        with PullConsumer("billing", "jobs", endpoint=endpoint, subscription="paid", batch_size=8,
                          idle_timeout_ms=1_000) as consumer:
            assert [m.body for m in consumer] == [m.body for m in paid]
            assert consumer.positions() == {0: 50, 1: 5}, "the position moves past every filtered-out message"
            assert client.consumer_lag("billing", "jobs") == {0: 0, 1: 0}, "committed once idle, not only at close"
        committed = [client.fetch_offset("billing", "jobs", queue_id) for queue_id in (0, 1)]
        assert committed == [client.queue_stats("jobs", queue_id)["max_offset"] for queue_id in (0, 1)] == [50, 5]
        assert client.consumer_lag("billing", "jobs") == {0: 0, 1: 0}


@pytest.mark.parametrize("on_the_host", [False, True], ids=["socket", "store_dir"])
def test_a_waiting_poll_is_answered_by_the_arrival_not_the_deadline(engine: EngineProcess, endpoint: str,
                                                                    on_the_host: bool) -> None:
    """Over the socket the pulls are parked at the engine; with ``store_dir`` the consumer waits on
    the engine's wake-ups itself."""
    store_dir = engine.store_dir if on_the_host else None
    with PullConsumer("late", "orders", endpoint=endpoint, start_from="latest", max_wait_ms=20_000,
                      store_dir=store_dir) as consumer:
        assert consumer.poll(0) == []  # over the socket, every queue's pull is now parked at the engine
        with Producer(endpoint) as producer:
            producer.send("orders", b"wake up", queue_id=3)
        started = time.monotonic()
        [message] = consumer.poll(30_000)
        assert message.body == b"wake up"
        assert time.monotonic() - started < 10, "answered by the message, not by the 20 s wait"


def test_start_from_latest_skips_what_was_there_and_seek_goes_back(engine: EngineProcess, endpoint: str) -> None:
    fill(endpoint, "jobs", 5, 2)
    with engine.client() as client:
        wait_dispatched(client)  # "latest" is the end of the queue as far as the engine dispatched
    with PullConsumer("new", "jobs", endpoint=endpoint, start_from="latest", auto_commit=False) as consumer:
        assert consumer.positions() == {0: 5, 1: 5}
        assert consumer.poll(200) == []
        consumer.seek(1, 3)
        assert [m.body for m in consumer.poll(10_000)] == [b"q1-3", b"q1-4"]


def test_a_missing_topic_or_queue_is_refused_at_once(endpoint: str) -> None:
    with pytest.raises(EngineError) as info:
        PullConsumer("g", "nowhere", endpoint=endpoint)
    assert info.value.code == ErrorCode.TOPIC_NOT_FOUND
    with pytest.raises(EngineError) as info:
        PullConsumer("g", "jobs", endpoint=endpoint, queue_ids=[5])
    assert info.value.code == ErrorCode.QUEUE_NOT_FOUND


def test_on_the_engines_host_the_group_reads_the_store_files_and_commits_through_the_engine(
        engine: EngineProcess, endpoint: str) -> None:
    bodies = fill(endpoint, "orders", 50, 4)
    with engine.client() as client:
        wait_dispatched(client)
    with PullConsumer("local", "orders", endpoint=endpoint, commit_every=10, store_dir=engine.store_dir) as consumer:
        first = take(consumer, 120)
        for queue_id in range(4):
            offsets = [m.queue_offset for m in first if m.queue_id == queue_id]
            assert offsets == list(range(len(offsets))), "each queue in order, none skipped"
        assert all(m.topic == "orders" and len(m.msg_id) == 32 for m in first)
    with PullConsumer("local", "orders", endpoint=endpoint, idle_timeout_ms=1_000) as consumer:  # over the socket
        rest = list(consumer)
    assert sorted(m.body for m in first + rest) == sorted(bodies), "nothing lost, nothing read twice"

