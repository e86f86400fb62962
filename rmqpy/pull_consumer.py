"""``PullConsumer``: a consumer group reading every queue of a topic, committing its offsets.

    with PullConsumer("billing", "orders", subscription="paid || refunded") as consumer:
        for message in consumer:                 # waits for messages (long polling)
            handle(message)                      # committed every 100 messages, when idle and at the end

How it reads. The consumer keeps one pull in flight per queue, all on one socket,
each parked at the engine until its queue has a message (long polling, ``max_wait_ms``),
so a message on any queue is handed out at once, and an idle consumer costs nothing.
A queue's next pull is sent once fewer than half a ``batch_size`` of its messages wait
in the consumer, so the next ones are there before these are handed out. Messages are
handed out one queue at a time in turn, among the queues that have some, so a queue
with a backlog never holds up a message that arrives on another. With a tag subscription
a pull waits at the engine only after one that found nothing new: a parked pull moves past
the messages the engine filters out without saying so until it is answered, so the pulls
that catch up are answered at once with where they got to.

Offsets. The group starts at its committed offset on each queue; a queue the group
never committed starts at its oldest message (``start_from="earliest"``) or at the
next one to come (``"latest"``). A message counts as finished when the application
comes back for more (the next iteration, ``poll``, ``commit``) or leaves the ``with``
block normally; only finished messages are committed, so after a crash or an exception
the group reads again what it had not finished: at least once. Messages the subscription
filtered out are finished once every message before them is (the position moves to the
pull's next offset). With ``auto_commit`` the consumer commits every ``commit_every``
messages finished or filtered out, when a poll finds nothing after the subscription
filtered some out (so an idle group's lag reaches 0), and when it closes; without, only
``commit()`` commits.

On the engine's host, ``store_dir`` reads the queues over the engine's own mapped files
(``engine.local_reads.LocalReads``: no socket per batch, the messages decoded straight from
the records) and waits for new ones on the engine's wake-ups; offsets are still fetched and
committed through the engine, which alone writes.

Groups. The consumers of one group (in any processes, on any hosts) share the topic's
queues: each is a member of the group, kept alive at the engine by heartbeats, and takes
its share by RocketMQ's average allocation (``rmqpy/_group_member.py``). When a member
joins, closes or dies, the others take up the queues anew between two polls. A queue
changes hands only once its member let it go (committing first, with ``auto_commit``) or
died, and the next member reads it from the committed offset: one reader at a time, and a
message read twice only if a member died between reading and committing it. A dead
member's queues move within about 4/3 of the engine's ``consumer_session_timeout_ms`` (6 s
by default), a closed member's within a third of it. With ``queue_ids`` the consumer reads
those queues and is no member.

Clusters. A consumer of a cluster of broker sets is a class of its own, ``ClusterPullConsumer``
(below): a ``PullConsumer`` per set, polled in turn; ``PullConsumer(..., cluster=...)`` returns one.

Not thread-safe: use a consumer from one thread at a time.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import zmq

from engine.client import DEFAULT_ENDPOINT, ClientError, EngineError
from engine.errors import RequestError
from engine.ipc.curve import CurveKeys
from rmqpy._channel import Channel, Outcome
from rmqpy._group_member import GroupMember
from rmqpy._queue_book import QueueBook, assigned_queues, first_offset
from rmqpy.cluster import Cluster, SetReaders, opened
from rmqpy.errors import ClientClosed
from rmqpy.message import Message, messages_from_wire
from rmqpy.retry import RetryPolicy, call_with_retry
from rmqpy.subscription import EVERYTHING, subscription_expression

if TYPE_CHECKING:
    from engine.local_reads import LocalReads

__all__ = ["ClusterPullConsumer", "PullConsumer"]

log = logging.getLogger(__name__)
_LOOK_INTERVAL_S = 0.001  # how often the socket is looked at while messages are buffered
_REBALANCE_LOOK_S = 0.1  # a member waiting for messages looks this often whether its share changed


class PullConsumer:
    def __new__(cls, group: str, topic: str, *, cluster: Cluster | str | None = None, **options: Any) -> Any:
        """Given ``cluster``, a ``ClusterPullConsumer`` with these options, not a ``PullConsumer``
        (typed ``Any`` as ``Producer.__new__`` is, for the same reason)."""
        if cluster is not None:
            return ClusterPullConsumer(cluster, group, topic, **options)
        return super().__new__(cls)

    def __init__(self, group: str, topic: str, *, endpoint: str = DEFAULT_ENDPOINT,
                 subscription: str | Iterable[str] = "*", queue_ids: Iterable[int] | None = None,
                 start_from: Literal["earliest", "latest"] = "earliest", auto_commit: bool = True,
                 commit_every: int = 100, batch_size: int = 32, max_wait_ms: int = 5_000,
                 idle_timeout_ms: int | None = None, timeout_ms: int = 10_000, retry: RetryPolicy | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None, curve: CurveKeys | None = None,
                 store_dir: str | Path | None = None, cluster: Cluster | str | None = None) -> None:
        """Connect and read the group's committed offsets (raises ``EngineError`` if the topic is missing).

        ``subscription``: ``"*"``, ``"a || b"`` or a list of tags. ``batch_size``: messages per
        pull, and per ``poll`` by default. ``max_wait_ms``: how long a pull waits at the engine
        for a message (at most 30 000), and ``poll``'s default wait. ``idle_timeout_ms``: the
        iteration ends after this long without a message (None: it never ends by itself).
        ``retry``: how refused pulls and commits are retried (reads are always safe to retry).
        ``store_dir``: the store of the engine ``endpoint`` names, on this host: pulls read its files
        in this process (``endpoints.NotRunning`` if no engine runs on it).
        ``queue_ids``: read these queues only, and take no share of the group's (None: be a member
        of the group and read the queues allocated to this member, which may change).
        ``cluster``: a cluster of broker sets (``rmqpy.cluster.Cluster``, or its address: etcd's
        ``http://host:port`` or any engine of it) instead of ``endpoint``: this consumer is a member
        of the group on every set serving the topic and reads them all (docs/cluster.md); a set's
        own queues (``queue_ids``, ``seek``, ``lag``, ``positions``) are then a set's consumer's.
        ``__new__`` answers it with a ``ClusterPullConsumer``: this class is one set's.
        """
        assert cluster is None, "PullConsumer.__new__ made a ClusterPullConsumer"
        if min(commit_every, batch_size, max_wait_ms) < 1:
            raise ValueError("commit_every, batch_size and max_wait_ms must be >= 1")
        self.group = group
        self.topic = topic
        self.subscription = subscription_expression(subscription)
        self.auto_commit = auto_commit
        self.commit_every = commit_every
        self.batch_size = batch_size
        self.max_wait_ms = max_wait_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.retry = retry or RetryPolicy()
        self._pulls: dict[int, tuple[int, int]] = {}  # request id -> (queue id, book token)
        self._next_look = 0.0  # when poll next reads the socket while messages are buffered
        self._closed = False
        self.start_from = start_from
        self._channel = Channel(endpoint, timeout_ms=timeout_ms, context=context, curve=curve)
        self._local: LocalReads | None = None
        self._member: GroupMember | None = None
        try:
            if queue_ids is None:
                self._member = GroupMember(group, topic, endpoint=endpoint, timeout_ms=timeout_ms, context=context,
                                           curve=curve)
                self._book = QueueBook({}, refill_below=max(1, self.batch_size // 2))
                self._rebalance()
            else:
                self._book = self._open_book(list(queue_ids))
            if store_dir is not None:
                from engine.local_reads import Build, LocalReads  # the store's modules only when asked for

                self._local = LocalReads(Path(store_dir))
                self._local_build = Build(Message, tuple_keys=True)  # its records built straight into Messages
        except BaseException:
            if self._member is not None:
                self._member.close()
            self._channel.close()
            raise

    def _open_book(self, queue_ids: list[int]) -> QueueBook:
        topics = call_with_retry(self.retry, self._channel.list_topics)
        starts = {queue_id: self._start(queue_id) for queue_id in assigned_queues(topics, self.topic, queue_ids)}
        return QueueBook(starts, refill_below=max(1, self.batch_size // 2))

    def _start(self, queue_id: int) -> tuple[int, int]:
        """Where the group reads ``queue_id`` from: (first offset, committed offset or -1)."""
        committed = call_with_retry(self.retry, functools.partial(self._channel.fetch_offset, self.group,
                                                                  self.topic, queue_id))
        if committed >= 0:
            return committed, committed
        stats = call_with_retry(self.retry, functools.partial(self._channel.queue_stats, self.topic, queue_id))
        return first_offset(stats, self.start_from), committed

    def _rebalance(self) -> None:
        """Move to the queues the group's membership gives this member now: those let go are committed
        first (with ``auto_commit``), those taken up start at the group's committed offsets."""
        assert self._member is not None
        held = self._book.queue_ids
        share = self._member.share(held)
        if share is None:
            return
        hold, target = share
        for queue_id in sorted(set(held) - set(hold)):
            position, committed = self._book.drop(queue_id)
            if self.auto_commit and position != committed:
                try:
                    call_with_retry(self.retry, functools.partial(self._channel.commit_offset, self.group, self.topic,
                                                                  queue_id, position))
                except ClientError as exc:  # its next member reads again from the last commit: at least once
                    log.warning("queue %d of %r left without its commit at %d: %s", queue_id, self.topic, position,
                                exc)
        self._member.reading(self._book.queue_ids)
        self._member.want(target)  # the queues let go are committed: the engine may give them to others
        for queue_id in sorted(set(hold) - set(held)):
            position, committed = self._start(queue_id)
            self._book.add(queue_id, position, committed)
        self._member.reading(self._book.queue_ids)
        if hold != held:
            log.info("group %r, topic %r: %s now reads queues %s", self.group, self.topic, self._member.client_id,
                     self._book.queue_ids)

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(finish=exc_type is None)

    def close(self, *, finish: bool = True) -> None:
        """Commit (with ``auto_commit``) and close. ``finish``: count the messages handed out as
        finished first; leaving ``with`` by an exception does not, so they are read again."""
        if self._closed:
            return
        try:
            if finish:
                self._book.finish()
            if self.auto_commit:
                self._commit()
        finally:
            self._closed = True
            if self._member is not None:
                self._member.close()
            self._channel.close()
            if self._local is not None:
                self._local.close()

    @property
    def socket(self) -> zmq.Socket[bytes]:
        """The socket replies come on: to wait on with others (``zmq.Poller``), then ``poll(0)``."""
        return self._channel._socket

    @property
    def queue_ids(self) -> list[int]:
        return self._book.queue_ids

    def queues(self) -> dict[str, list[int]]:
        """The queues this member reads now, per broker set (one set: its broker name is "")."""
        return {"": self._book.queue_ids}

    def positions(self) -> dict[int, int]:
        """Per queue, the first offset not yet finished: what the next commit records."""
        return self._book.positions()

    # -- reading -----------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        """Messages one by one, waiting for more; ends after ``idle_timeout_ms`` without any, or on close."""
        idle_since = time.monotonic()
        book = self._book
        while not self._closed:
            # Between two looks at the socket (or the files), with nothing to commit or rebalance, the
            # next message comes straight from the book: poll's own path, without its waits.
            now = time.monotonic()
            if now < self._next_look and (self._member is None or not self._member.changed(now)) and \
                    not (self.auto_commit and book.finished_since_commit + book.skipped_since_commit >=
                         self.commit_every):
                book.finish()
                message = book.take_one()
                if message is not None:
                    yield message
                    idle_since = time.monotonic()
                    continue
            if self.idle_timeout_ms is None:
                wait_ms = self.max_wait_ms
            else:
                wait_ms = max(0, int(self.idle_timeout_ms - (time.monotonic() - idle_since) * 1000))
            messages = self.poll(wait_ms, max_messages=1)
            if messages:
                yield messages[0]
                idle_since = time.monotonic()
            elif self.idle_timeout_ms is not None and wait_ms == 0:
                return

    def poll(self, timeout_ms: int | None = None, *, max_messages: int | None = None) -> list[Message]:
        """Up to ``max_messages`` (default ``batch_size``) messages, waiting up to ``timeout_ms``
        (default ``max_wait_ms``) for the first; [] if none came. Finishes those of the last poll."""
        if self._closed:
            raise ClientClosed("the consumer is closed")
        self._book.finish()
        if self.auto_commit and self._book.finished_since_commit + self._book.skipped_since_commit >= \
                self.commit_every:
            self._commit()
        now = time.monotonic()
        if self._member is not None and self._member.changed(now):
            self._rebalance()
        deadline = now + (self.max_wait_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            # While messages are buffered, the socket (or the store's files) is looked at once a
            # millisecond, not at every message (a look that finds nothing costs more than handing
            # out a message); a queue whose pull was answered meanwhile still takes its turn within
            # that millisecond.
            if now < self._next_look:
                taken = self._book.take(max_messages or self.batch_size)
                if taken:
                    return taken
            if self._local is not None:
                self._pull_locally(now)
            else:
                self._send_pulls(now)
                self._take_replies(self._channel.replies(0))  # every queue that answered takes its turn
            self._next_look = now + _LOOK_INTERVAL_S
            taken = self._book.take(max_messages or self.batch_size)
            if taken:
                return taken
            now = time.monotonic()
            if now >= deadline:
                if self.auto_commit and self._book.skipped_since_commit:
                    self._commit()  # no message to come would carry the group past what was filtered out
                return []
            wake = min(deadline, self._book.next_retry_at() or deadline)
            if self._member is not None:
                if self._member.changed(now):
                    self._rebalance()  # nothing is in hand here: queues may come and go
                wake = min(wake, now + _REBALANCE_LOOK_S)
            if self._local is not None:
                self._local.wait_for_new(self.topic, self._book.queue_ids, wake)
            else:
                self._take_replies(self._channel.replies(max(1, int((wake - now) * 1000))))
            now = time.monotonic()

    def _send_pulls(self, now: float) -> None:
        for queue_id, offset, token in self._book.to_pull(now):
            wait_ms = self._pull_wait_ms(queue_id)
            request_id = self._channel.submit(
                "pull", wait_ms=wait_ms, topic=self.topic, queue_id=queue_id, offset=offset,
                max_messages=self.batch_size, subscription=self.subscription, max_wait_ms=wait_ms)
            self._pulls[request_id] = (queue_id, token)

    def _pull_wait_ms(self, queue_id: int) -> int:
        """How long a pull of ``queue_id`` waits at the engine: ``max_wait_ms``, but with a tag subscription
        only once the queue's last pull found nothing new (a parked pull moves past what the subscription
        filters out unseen, and the position could not follow it)."""
        return self.max_wait_ms if self.subscription == EVERYTHING or self._book.caught_up(queue_id) else 0

    def _pull_locally(self, now: float) -> None:
        """Each queue that wants messages reads them from the store's files (``store_dir``); a refusal
        that retrying cannot cure is raised after every queue had its turn."""
        assert self._local is not None
        refusal: EngineError | None = None
        for queue_id, offset, token in self._book.to_pull(now):
            try:
                reply, messages = self._local.pull_built(self.topic, queue_id, offset, self._local_build,
                                                         max_messages=self.batch_size, subscription=self.subscription)
            except RequestError as exc:
                error = EngineError(int(exc.code), exc.code.name, exc.message, dict(exc.details))
                refusal = refusal or self._pull_failed(queue_id, token, error)
                continue
            assert reply.next_offset is not None
            self._book.pulled(queue_id, token, messages, reply.next_offset)
        if refusal is not None:
            raise refusal

    def _take_replies(self, replies: list[tuple[int, Outcome]]) -> None:
        """Give each reply to the book; a refusal that retrying cannot cure is raised after all are in."""
        refusal: EngineError | None = None
        for request_id, outcome in replies:
            queue_id, token = self._pulls.pop(request_id)
            if isinstance(outcome, dict):
                self._book.pulled(queue_id, token, messages_from_wire(outcome["messages"]), outcome["next_offset"])
                continue
            refusal = refusal or self._pull_failed(queue_id, token, outcome)
        if refusal is not None:
            raise refusal

    def _pull_failed(self, queue_id: int, token: int, outcome: object) -> EngineError | None:
        """The queue pulls again after a back-off; the refusal, if retrying cannot cure it."""
        pause_ms = self.retry.backoff_ms(self._book.failures(queue_id) + 1, jitter=random.random())
        self._book.failed(queue_id, token, time.monotonic() + pause_ms / 1000)
        if isinstance(outcome, EngineError) and outcome.code not in self.retry.retriable_codes:
            outcome.details.setdefault("queue_id", queue_id)
            return outcome
        return None

    # -- offsets -----------------------------------------------------------

    def commit(self) -> None:
        """Count every message handed out as finished and commit the group's positions now."""
        if self._closed:
            raise ClientClosed("the consumer is closed")
        self._book.finish()
        self._commit()

    def _commit(self) -> None:
        for queue_id, offset in self._book.to_commit().items():
            call_with_retry(self.retry, functools.partial(self._channel.commit_offset, self.group, self.topic,
                                                          queue_id, offset))
            self._book.committed(queue_id, offset)
        self._book.commit_done()

    def seek(self, queue_id: int, offset: int) -> None:
        """Read ``queue_id`` from ``offset`` on (for example past a ``MESSAGE_CORRUPT`` record)."""
        self._book.seek(queue_id, offset)

    def lag(self) -> dict[int, int]:
        """Per queue, the messages after the group's position (as far as dispatch has come)."""
        positions = self._book.positions()
        return {queue_id: max(0, self._channel.queue_stats(self.topic, queue_id)["max_offset"] - position)
                for queue_id, position in positions.items()}


class ClusterPullConsumer:
    """A member of ``group`` on every broker set serving ``topic`` (docs/cluster.md, "Clients"): a
    ``PullConsumer`` per set, on the set's master, polled in turn; messages from all of them.
    Options are ``PullConsumer``'s, but for what names a single set (``endpoint``, ``queue_ids``,
    ``store_dir``). ``queues()`` says which queues it reads on each set; what names one set's own
    queues (``queue_ids``, ``positions``, ``seek``, ``lag``) is refused with ``ClientError``."""

    def __init__(self, cluster: Cluster | str, group: str, topic: str, *, max_wait_ms: int = 5_000,
                 idle_timeout_ms: int | None = None, **consumer_options: Any) -> None:
        if {"endpoint", "queue_ids", "store_dir"} & consumer_options.keys():
            raise ValueError("a consumer on a cluster reads the group's share of every set: endpoint, queue_ids "
                             "and store_dir are a single set's")
        self.cluster, self._owns_cluster = opened(cluster)
        self.group = group
        self.topic = topic
        self.max_wait_ms = max_wait_ms
        self.idle_timeout_ms = idle_timeout_ms
        self._sets = SetReaders(self.cluster, topic, lambda endpoint: PullConsumer(
            group, topic, endpoint=endpoint, max_wait_ms=max_wait_ms, **consumer_options), _drop_pull)
        self._turn = 0
        self._closed = False
        try:
            self._sets.follow(fresh=False)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ClusterPullConsumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(finish=exc_type is None)

    def close(self, *, finish: bool = True) -> None:
        """Each set's ``PullConsumer.close``, then the routes if they were opened here."""
        if self._closed:
            return
        self._closed = True
        for consumer in self._sets.consumers():
            consumer.close(finish=finish)
        self._sets.readers.clear()
        if self._owns_cluster:
            self.cluster.close()

    def queues(self) -> dict[str, list[int]]:
        """The queues this member reads now, per broker set."""
        return {broker: consumer.queue_ids for broker, (_e, consumer) in self._sets.readers.items()}

    @property
    def queue_ids(self) -> list[int]:
        raise _one_set("queue_ids")

    def positions(self) -> dict[int, int]:
        raise _one_set("positions")

    def seek(self, queue_id: int, offset: int) -> None:
        raise _one_set("seek")

    def lag(self) -> dict[int, int]:
        raise _one_set("lag")

    def __iter__(self) -> Iterator[Message]:
        idle_since = time.monotonic()
        while not self._closed:
            messages = self.poll(self.max_wait_ms if self.idle_timeout_ms is None else
                                 max(0, int(self.idle_timeout_ms - (time.monotonic() - idle_since) * 1000)),
                                 max_messages=1)
            if messages:
                yield messages[0]
                idle_since = time.monotonic()
            elif self.idle_timeout_ms is not None and time.monotonic() - idle_since >= self.idle_timeout_ms / 1000:
                return

    def poll(self, timeout_ms: int | None = None, *, max_messages: int | None = None) -> list[Message]:
        """Messages of one broker set (each set in turn), waiting up to ``timeout_ms`` for the first."""
        if self._closed:
            raise ClientClosed("the consumer is closed")
        deadline = time.monotonic() + (self.max_wait_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            if self._sets.due():
                self._sets.follow(fresh=True)
            for _broker, consumer in self._sets.in_turn(self._turn):
                self._turn += 1
                messages = consumer.poll(0, max_messages=max_messages)
                if messages:
                    return messages
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            poller = zmq.Poller()
            for consumer in self._sets.consumers():
                poller.register(consumer.socket, zmq.POLLIN)
            poller.poll(max(1, int(min(remaining, 0.1) * 1000)))

    def commit(self) -> None:
        if self._closed:
            raise ClientClosed("the consumer is closed")
        for consumer in self._sets.consumers():
            consumer.commit()


def _one_set(what: str) -> ClientError:
    return ClientError(f"{what} names a broker set's own queues: a consumer on a cluster has none of "
                       f"its own (queues() lists them per set)")


def _drop_pull(consumer: PullConsumer) -> None:
    """A set's consumer whose master moved: closed without the commit the old master cannot take (at
    least once: its last messages are read again)."""
    consumer.auto_commit = False
    consumer.close(finish=False)
