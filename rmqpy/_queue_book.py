"""``QueueBook``: a pull consumer's offsets and buffers, with no I/O (both consumers share it).

Per queue of the topic the book keeps three offsets:

* ``fetch_offset``: where the next pull starts (the last reply's ``next_offset``, which with a
  subscription is past the messages the engine filtered out);
* ``position``: the first offset the application has not finished; what a commit records;
* ``committed``: the last position committed (-1: none yet).

Invariants, per queue: ``committed`` is a ``position`` the book once had, and messages
are handed out in queue offset order, each once, between ``position`` and
``fetch_offset`` (both move back only on a ``seek`` or when the engine says the queue
is shorter than the group thought, ``OFFSET_OVERFLOW_BADLY``).

A message is *handed out* by ``take`` and *finished* by ``finish``: the consumer
finishes the messages it handed out when the application comes back for more, commits,
or closes normally, so a commit never covers a message the application did not finish
(at least once). Messages the subscription skipped count as finished as soon as the
queue has nothing before them in hand: the position jumps to ``fetch_offset``, and
``skipped_since_commit`` counts them, for the consumer to commit them though no message
it hands out will carry the position past them.

A pull that the engine parks (long polling) may move past filtered-out messages without
saying so until it is answered: ``caught_up`` tells whether a queue's last pull found
nothing new where it started, so only then does the consumer let the next one wait at
the engine; a pull after one that moved on is answered at once with where it got to.

Queues come and go (``add``, ``drop``) as a group's members share a topic's queues out
again: a dropped queue's pull in flight is ignored when it answers, and its position is
what the member commits before another takes the queue.

Fairness: ``take`` goes round the queues, one message from each in turn, and the next
call goes on from the queue after the last one served, so a busy queue cannot starve
the others.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping, Sequence

from engine.client import EngineError
from engine.errors import ErrorCode
from rmqpy.message import Message


class QueueState:
    __slots__ = ("buffer", "caught_up", "committed", "failures", "fetch_offset", "in_hand", "position", "pull_token",
                 "retry_at")

    def __init__(self, position: int, committed: int) -> None:
        self.fetch_offset = position
        self.position = position
        self.committed = committed
        self.buffer: deque[Message] = deque()
        self.in_hand = 0  # messages of this queue handed out and not finished
        self.pull_token: int | None = None  # the pull in flight whose reply the book will take
        self.retry_at = 0.0  # monotonic seconds: no pull before this, after a failed one
        self.failures = 0  # failed pulls in a row
        self.caught_up = False  # the last pull found nothing new where it started


class QueueBook:
    def __init__(self, starts: Mapping[int, tuple[int, int]], *, refill_below: int = 1) -> None:
        """``starts``: queue id -> (first offset to consume, committed offset or -1).
        ``refill_below``: a queue with fewer buffered messages pulls again (if no pull is in
        flight), so that its next messages are there before the last are handed out."""
        assert refill_below >= 1, refill_below
        self._refill_below = refill_below
        self._queues = {queue_id: QueueState(position, committed)
                        for queue_id, (position, committed) in sorted(starts.items())}
        self._order = list(self._queues)
        self._cursor = 0
        self._in_hand: list[Message] = []
        self._tokens = itertools.count(1)
        self.finished_since_commit = 0
        self.skipped_since_commit = 0  # offsets the positions moved past with no message handed out

    @property
    def queue_ids(self) -> list[int]:
        return list(self._order)

    def positions(self) -> dict[int, int]:
        return {q: s.position for q, s in self._queues.items()}

    def caught_up(self, queue_id: int) -> bool:
        """Whether the last pull of ``queue_id`` found nothing new at its offset (no message, the same
        next offset): the next pull may then wait at the engine for one."""
        state = self._queues.get(queue_id)
        return state is not None and state.caught_up

    # -- pulls ---------------------------------------------------------------

    def to_pull(self, now: float) -> list[tuple[int, int, int]]:
        """The pulls to send now, as (queue id, offset, token): one per queue with fewer than
        ``refill_below`` messages buffered, no pull in flight and no retry pending. They
        count as in flight from now."""
        pulls = []
        for queue_id, state in self._queues.items():
            if len(state.buffer) < self._refill_below and state.pull_token is None and state.retry_at <= now:
                state.pull_token = next(self._tokens)
                pulls.append((queue_id, state.fetch_offset, state.pull_token))
        return pulls

    def pulled(self, queue_id: int, token: int, messages: Sequence[Message], next_offset: int) -> bool:
        """Take a pull's reply; False if it is stale (a seek came since, or the queue was dropped), and
        then nothing changes."""
        state = self._queues.get(queue_id)
        if state is None or token != state.pull_token:
            return False
        state.pull_token = None
        state.failures = 0
        state.retry_at = 0.0
        assert all(m.queue_id == queue_id for m in messages)
        assert [m.queue_offset for m in messages] == sorted(m.queue_offset for m in messages)
        state.buffer.extend(m for m in messages if m.queue_offset >= state.fetch_offset)
        state.caught_up = not messages and next_offset == state.fetch_offset
        state.fetch_offset = next_offset
        self._settle(state)
        return True

    def failed(self, queue_id: int, token: int, retry_at: float) -> int:
        """A pull ended without a reply to use; pull again from the same offset at ``retry_at``.
        Returns the failures in a row, for the backoff."""
        state = self._queues.get(queue_id)
        if state is None:
            return 0
        if token == state.pull_token:
            state.pull_token = None
            state.failures += 1
            state.retry_at = retry_at
        return state.failures

    def failures(self, queue_id: int) -> int:
        state = self._queues.get(queue_id)
        return 0 if state is None else state.failures

    def next_retry_at(self) -> float | None:
        """The earliest time a failed queue may be pulled again (None: no retry pending)."""
        pending = [s.retry_at for s in self._queues.values() if s.pull_token is None and s.retry_at > 0]
        return min(pending) if pending else None

    def seek(self, queue_id: int, offset: int) -> None:
        """Consume ``queue_id`` from ``offset`` on: buffered messages go, a pull in flight is ignored."""
        state = self._queues[queue_id]
        state.buffer.clear()
        self._in_hand = [m for m in self._in_hand if m.queue_id != queue_id]
        state.in_hand = 0
        state.pull_token = None
        state.retry_at = 0.0
        state.caught_up = False
        state.fetch_offset = state.position = offset

    def add(self, queue_id: int, position: int, committed: int) -> None:
        """Consume ``queue_id`` too, from ``position`` (``committed``: the group's commit, or -1)."""
        assert queue_id not in self._queues, queue_id
        self._queues[queue_id] = QueueState(position, committed)
        self._order = sorted(self._queues)
        self._cursor = 0

    def drop(self, queue_id: int) -> tuple[int, int]:
        """Stop consuming ``queue_id`` (nothing of it may be in hand): its (position, committed).
        Its buffered messages go; another member reads them from the position."""
        state = self._queues.pop(queue_id)
        assert state.in_hand == 0, "finish the messages handed out before dropping their queue"
        self._order = sorted(self._queues)
        self._cursor = 0
        return state.position, state.committed

    # -- handing out and finishing -----------------------------------------------

    def take(self, count: int) -> list[Message]:
        """Hand out up to ``count`` buffered messages, one queue at a time in turn."""
        assert count >= 1
        if count == 1:
            message = self.take_one()
            return [] if message is None else [message]
        taken: list[Message] = []
        idle = 0  # queues looked at in a row that had nothing
        while len(taken) < count and idle < len(self._order):  # (no queue: nothing)
            state = self._queues[self._order[self._cursor]]
            self._cursor = (self._cursor + 1) % len(self._order)
            if state.buffer:
                taken.append(state.buffer.popleft())
                state.in_hand += 1
                idle = 0
            else:
                idle += 1
        self._in_hand.extend(taken)
        return taken

    def take_one(self) -> Message | None:
        """``take(1)``'s message, or None: a consumer iterating one by one asks between every two messages."""
        order = self._order
        for _ in order:
            state = self._queues[order[self._cursor]]
            self._cursor = (self._cursor + 1) % len(order)
            if state.buffer:
                message = state.buffer.popleft()
                state.in_hand += 1
                self._in_hand.append(message)
                return message
        return None

    def finish(self) -> int:
        """The application finished every message handed out; returns how many that was."""
        if len(self._in_hand) == 1:  # a consumer iterating one by one: between every two messages
            message = self._in_hand.pop()
            state = self._queues[message.queue_id]
            state.position = message.queue_offset + 1
            state.in_hand -= 1
            self._settle(state)
            self.finished_since_commit += 1
            return 1
        for message in self._in_hand:
            state = self._queues[message.queue_id]
            state.position = message.queue_offset + 1
            state.in_hand -= 1
        for state in {id(s): s for s in (self._queues[m.queue_id] for m in self._in_hand)}.values():
            self._settle(state)
        count = len(self._in_hand)
        self._in_hand.clear()
        self.finished_since_commit += count
        return count

    def _settle(self, state: QueueState) -> None:
        """Nothing of the queue buffered or in hand: everything before ``fetch_offset`` is done (what the
        subscription skipped, counted in ``skipped_since_commit``)."""
        if not state.buffer and state.in_hand == 0:
            self.skipped_since_commit += max(0, state.fetch_offset - state.position)
            state.position = state.fetch_offset

    # -- commits -------------------------------------------------------------------

    def to_commit(self) -> dict[int, int]:
        """The positions that differ from the last commit."""
        return {q: s.position for q, s in self._queues.items() if s.position != s.committed}

    def committed(self, queue_id: int, offset: int) -> None:
        state = self._queues.get(queue_id)
        if state is not None:
            state.committed = offset

    def commit_done(self) -> None:
        self.finished_since_commit = 0
        self.skipped_since_commit = 0


# -- where a consumer starts (shared by the blocking and the asyncio consumer) -----------------

START_FROM = ("earliest", "latest")


def assigned_queues(topics: Sequence[Mapping[str, object]], topic: str, queue_ids: Sequence[int] | None) -> list[int]:
    """The queues to consume: ``queue_ids``, or all of the topic's; raises if the topic has no such queue."""
    counts = {t["topic"]: t["queue_count"] for t in topics}
    if topic not in counts:
        raise EngineError(ErrorCode.TOPIC_NOT_FOUND, ErrorCode.TOPIC_NOT_FOUND.name, f"no topic {topic!r}")
    count = counts[topic]
    assert isinstance(count, int)
    chosen = sorted(set(range(count) if queue_ids is None else queue_ids))
    if not chosen or chosen[0] < 0 or chosen[-1] >= count:
        raise EngineError(ErrorCode.QUEUE_NOT_FOUND, ErrorCode.QUEUE_NOT_FOUND.name,
                          f"topic {topic!r} has queues 0..{count - 1}, not {queue_ids}")
    return chosen


def first_offset(stats: Mapping[str, int], start_from: str) -> int:
    """Where a group that never committed on a queue starts: its oldest message, or the next one to come."""
    assert start_from in START_FROM, start_from
    return stats["min_offset"] if start_from == "earliest" else stats["max_offset"]
