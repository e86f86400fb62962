"""A pull consumer's book alone: fair hand-out, finished positions, skipped messages, seeks."""

from __future__ import annotations

import pytest

from rmqpy._queue_book import QueueBook
from rmqpy.message import Message
from rmqpy.subscription import subscription_expression

pytestmark = pytest.mark.timeout(10)


def message(queue_id: int, offset: int) -> Message:
    return Message(topic="t", queue_id=queue_id, queue_offset=offset, msg_id="0" * 32, body=b"x",
                   born_timestamp=0, store_timestamp=0, commit_log_offset=0, store_size=1)


def pull_everything(book: QueueBook, batches: dict[int, list[int]], next_offsets: dict[int, int]) -> None:
    for queue_id, offset, token in book.to_pull(now=0.0):
        assert offset == book.positions()[queue_id]
        book.pulled(queue_id, token, [message(queue_id, o) for o in batches.get(queue_id, [])],
                    next_offsets.get(queue_id, offset))


def test_messages_are_handed_out_one_queue_at_a_time_and_a_busy_queue_starves_none() -> None:
    book = QueueBook({0: (0, -1), 1: (0, -1), 2: (0, -1)})
    pull_everything(book, {0: list(range(10)), 1: [0, 1], 2: [0]}, {0: 10, 1: 2, 2: 1})
    first = [(m.queue_id, m.queue_offset) for m in book.take(4)]
    assert first == [(0, 0), (1, 0), (2, 0), (0, 1)]
    assert [(m.queue_id, m.queue_offset) for m in book.take(1)] == [(1, 1)], "the next call goes on from queue 1"
    assert [m.queue_id for m in book.take(3)] == [0, 0, 0], "only queue 0 has messages left"
    assert book.to_pull(now=0.0) == [(1, 2, 4), (2, 1, 5)], "drained queues pull again, the busy one does not"


def test_one_at_a_time_hands_out_and_finishes_as_a_batch_does() -> None:
    """take(1) and finish() of one message (an iterating consumer's path) against take(n) and finish()."""
    batches, next_offsets = {0: list(range(7)), 1: [0, 1, 2], 2: []}, {0: 7, 1: 3, 2: 5}
    one, many = QueueBook(dict.fromkeys(range(3), (0, -1))), QueueBook(dict.fromkeys(range(3), (0, -1)))
    pull_everything(one, batches, next_offsets)
    pull_everything(many, batches, next_offsets)
    singles, seen = [], []
    while taken := one.take(1):
        singles += taken
        assert one.finish() == 1
        seen.append(one.positions())
    batch = many.take(100)
    assert [(m.queue_id, m.queue_offset) for m in singles] == [(m.queue_id, m.queue_offset) for m in batch]
    assert seen[0] == {0: 1, 1: 0, 2: 5}, "queue 2 was all filtered out; queue 0's first message finished"
    assert many.finish() == 10 and one.positions() == many.positions() == {0: 7, 1: 3, 2: 5}
    assert one.finished_since_commit == many.finished_since_commit == 10
    assert one.skipped_since_commit == many.skipped_since_commit == 5


def test_only_finished_messages_move_the_position_and_skipped_ones_count_as_finished() -> None:
    book = QueueBook({0: (5, 5), 1: (0, -1)})
    pull_everything(book, {0: [5, 6]}, {0: 9, 1: 4})  # queue 1: four messages, all filtered out
    assert book.positions() == {0: 5, 1: 4}
    assert book.to_commit() == {1: 4}
    [taken] = book.take(1)
    assert book.positions()[0] == 5, "handed out, not finished"
    assert book.finish() == 1
    assert book.positions()[0] == taken.queue_offset + 1 == 6
    book.take(1)
    book.finish()
    assert book.positions()[0] == 9, "past the skipped 7 and 8 once nothing is in hand"
    book.committed(0, 9)
    book.committed(1, 4)
    assert book.to_commit() == {}


def test_skipped_messages_are_counted_for_the_commit_and_a_queue_waits_only_once_caught_up() -> None:
    book = QueueBook({0: (0, -1), 1: (0, -1)})
    assert not book.caught_up(0), "the first pull says where the queue stands before any waits"
    pull_everything(book, {0: [0]}, {0: 8, 1: 5})  # queue 0: one message, then 7 filtered out; queue 1: 5
    assert book.skipped_since_commit == 5, "queue 1's five, at once: nothing of it is in hand"
    assert not book.caught_up(0) and not book.caught_up(1), "both moved on: the next pulls are answered at once"
    book.take(1)
    book.finish()
    assert book.positions() == {0: 8, 1: 5}
    assert (book.finished_since_commit, book.skipped_since_commit) == (1, 12)
    pull_everything(book, {}, {})  # nothing new where they start
    assert book.caught_up(0) and book.caught_up(1), "now a pull may wait at the engine"
    book.commit_done()
    assert (book.finished_since_commit, book.skipped_since_commit) == (0, 0)
    book.seek(1, 0)
    assert not book.caught_up(1)


def test_a_seek_drops_the_buffer_and_the_reply_of_the_pull_in_flight() -> None:
    book = QueueBook({0: (0, -1)})
    [(_, _, stale)] = book.to_pull(now=0.0)
    book.seek(0, 100)
    [(_, offset, fresh)] = book.to_pull(now=0.0)
    assert offset == 100
    assert not book.pulled(0, stale, [message(0, 0)], 1), "the reply from before the seek is ignored"
    assert book.pulled(0, fresh, [message(0, 100)], 101)
    assert [m.queue_offset for m in book.take(5)] == [100]


def test_a_failed_pull_waits_for_its_retry_time() -> None:
    book = QueueBook({0: (0, -1)})
    [(_, _, token)] = book.to_pull(now=0.0)
    assert book.failed(0, token, retry_at=10.0) == 1
    assert book.to_pull(now=5.0) == []
    assert book.next_retry_at() == 10.0
    assert [q for q, _, _ in book.to_pull(now=10.0)] == [0]


def test_subscriptions_are_star_or_tags_joined_by_bars() -> None:
    assert subscription_expression("*") == "*"
    assert subscription_expression("paid||refunded") == "paid || refunded"
    assert subscription_expression(["paid", "refunded"]) == "paid || refunded"
    bad: str | list[str]
    for bad in ("", "a || ", "* || a", []):
        with pytest.raises(ValueError):
            subscription_expression(bad)
