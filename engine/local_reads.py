"""Reads of a running engine's store in the caller's own process, over the shared mapped files.

A consumer on the engine's host need not cross a socket for every batch: the files are shared
already. ``LocalReads`` maps the ConsumeQueues, the CommitLog and the IndexFiles read-only, as
the owners and the front do, learns how far it may read from the shared offsets (the run
directory's ``offsets`` file, mapped read-only), and decodes with the C codec:

* ``pull``: what the owner's ``pull`` answers, from the same ``services/owner/pull.py``, never past
  the visible end (confirmed; under SYNC_FLUSH also flushed). With ``max_wait_ms`` it waits for
  new records on the writer's ``confirmed`` channel (a SUB, as the reput dispatcher's), then
  for the queue's owner to have applied them (its slot), instead of asking anyone;
* ``query_by_key``: ``services/front/key_lookup.py``, as the front answers it;
* ``get_by_id`` / ``get_by_offset``: one record read from the log.

Commits, pops, acks and sends still go through the engine: only the engine writes.

Why mappings cannot be pulled from under a reader: the engine never shrinks a file another
process maps. CommitLog segments and ConsumeQueue files are created whole (written under a
temporary name, then renamed) and only ever unlinked by retention; an unlinked file stays
readable through a mapping until it is unmapped, so a reader that raced retention reads the
old bytes (and refuses them by the log's minimum offset), never a SIGBUS. Units past the
visible end, and units a killed owner tore, are refused by the same record checks the owner
uses: a unit must lead to an intact record of its own topic, queue and queue offset. A queue
left from before its topic's deletion (its owner has not removed it yet) is not opened: the
new life's files come once it is gone. A reader outlives the engine's restarts: each start
makes a new shared offsets file and marks the last one's run over (``RUN_OVER``, as does a
clean stop); a reader that sees the mark lets go of all it knew of the last run and reads
afresh from the next start's file (the seeded simulation keeps such a reader through kills,
restarts and deletions, ``harness/simulation``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zmq

from engine.config import StoreConfig, decode_config
from engine.errors import ErrorCode, GetStatus, RequestError
from engine.ipc import channels, endpoints
from engine.ipc.protocol import MessageView, PullReply
from engine.services.front.key_lookup import KeyLookup
from engine.services.owner.pull import Build, PullResult, Subscription, pull
from engine.services.owner.queue_reads import NOTHING_YET, msg_id_offset, read_record
from engine.store.commit_log import CommitLogReader
from engine.store.consume_queue import ConsumeQueue
from engine.store.deleted_topics import DeletedTopics
from engine.store.records import owner_of
from engine.store.shared_offsets import (
    CONFIRMED,
    MIN_OFFSET,
    RUN_OVER,
    TOPIC_DELETIONS,
    SharedOffsets,
    owner_slot,
)

_APPLY_POLL_S = 0.000_5  # while the owner applies records already confirmed: a few ms at most
__all__ = ["Build", "LocalReads"]  # Build: what a reader builds its messages as (pull_built)

_VIEWS = Build(MessageView, tuple_keys=False)  # what ``pull`` builds from each record


class LocalReads:
    """Reads of the engine running on ``store_dir``, in this process; ``endpoints.NotRunning`` if none runs."""

    def __init__(self, store_dir: Path, *, run_dir: Path | None = None, config: StoreConfig | None = None) -> None:
        """``run_dir`` and ``config``: an engine's that is not found by its store directory (the
        simulation's), instead of the running engine's own."""
        self.store_dir = store_dir.resolve()
        self.run_dir = run_dir or endpoints.run_dir_for(self.store_dir)
        try:
            self.config: StoreConfig = config or decode_config((self.run_dir / "config.json").read_bytes())
            self.slots = SharedOffsets(self.run_dir, writable=False)
        except FileNotFoundError:
            raise endpoints.NotRunning(f"no engine is running on {self.store_dir}") from None
        self.sync_flush = self.config.flush_mode == "SYNC_FLUSH"
        self.reader = CommitLogReader.for_config(self.store_dir, self.config)
        self.deleted_topics = DeletedTopics(self.store_dir)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.deletions = -1
        self.log_min = -1
        self._lookup: KeyLookup | None = None
        self._zmq: zmq.Context[zmq.Socket[bytes]] | None = None
        self._wakes: zmq.Socket[bytes] | None = None

    def _started_again(self) -> None:
        """The run this reader mapped is over (``RUN_OVER``): its offsets are frozen, and the next
        start's recovery may make queue files anew. Once the next start's offsets are there, all
        of it is let go and read afresh (until then, what the last run made visible is read)."""
        try:
            slots = SharedOffsets(self.run_dir, writable=False)
        except FileNotFoundError:
            return
        if slots.get(RUN_OVER):  # the stopped run's, not removed yet
            slots.close()
            return
        for cq in self.queues.values():
            cq.close()
        self.queues.clear()
        self.slots.close()
        self.slots = slots
        self.reader.segments.close()
        self.reader = CommitLogReader.for_config(self.store_dir, self.config)
        self.deleted_topics = DeletedTopics(self.store_dir)
        self.deletions = self.log_min = -1
        if self._lookup is not None:
            self._lookup.close()
            self._lookup = None

    # -- what may be read ------------------------------------------------------------------------

    def visible_end(self) -> int:
        return self.slots.visible_end(sync_flush=self.sync_flush, sync_replication=self.config.reads_wait_for_replicas)

    def _follow(self) -> None:
        """Deleted topics and retention, as the owners follow them: a deleted queue's files are
        read again (they are gone, or a new life of the topic began); gone segments are let go.
        And a new start of the engine (``_started_again``)."""
        if self.slots.get(RUN_OVER):
            self._started_again()
        deletions = self.slots.get(TOPIC_DELETIONS)
        if deletions != self.deletions:
            self.deletions = deletions
            self.deleted_topics.follow(deletions)
            for cq in self.queues.values():
                cq.close()
            self.queues.clear()
        log_min = self.slots.get(MIN_OFFSET)
        if log_min != self.log_min:
            self.log_min = log_min
            self.reader.segments.refresh()
            for cq in self.queues.values():  # as the owner's ``drop_before`` moves its queues' start
                cq.min_offset = cq.first_live_unit(self.reader.min_offset())

    def _queue(self, topic: str, queue_id: int, offset: int) -> ConsumeQueue | None:
        """The queue, its end looked at again when ``offset`` is at or past what this process knew
        (``follow_end``: the units its owner appended since), opened again below its start."""
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is not None and offset >= cq.max_offset:
            cq.follow_end()
        if cq is None or offset < cq.min_offset:
            if cq is not None:
                cq.close()
            cq = ConsumeQueue(self.store_dir, topic, queue_id, file_units=self.config.consume_queue_file_units,
                              writable=False)
            # None yet, or the files of a deleted topic's earlier life that its owner has not
            # removed yet (the new life's are made once they are gone): asked again next time
            if (cq.max_offset == 0 and not cq.files.known) or self.deleted_topics.is_leftover(cq):
                cq.close()
                self.queues.pop(key, None)
                return None
            cq.min_offset = cq.first_live_unit(self.reader.min_offset())
            self.queues[key] = cq
        return cq

    # -- pulls ----------------------------------------------------------------------------------

    def pull(self, topic: str, queue_id: int, offset: int, *, max_messages: int = 32, max_bytes: int | None = None,
             subscription: str = "*", max_wait_ms: int = 0) -> PullReply:
        """What the ``pull`` op answers (docs/protocol.md 4.2), typed: status, next/min/max offsets and the
        messages (``MessageView``s, built straight from the records); RequestError as the op refuses
        (MESSAGE_CORRUPT for a damaged record met first)."""
        reply, messages = self.pull_built(topic, queue_id, offset, _VIEWS, max_messages=max_messages,
                                          max_bytes=max_bytes, subscription=subscription, max_wait_ms=max_wait_ms)
        reply.messages = messages
        return reply

    def pull_built(self, topic: str, queue_id: int, offset: int, build: Build, *, max_messages: int = 32,
                   max_bytes: int | None = None, subscription: str = "*",
                   max_wait_ms: int = 0) -> tuple[PullReply, list[Any]]:
        """``pull`` with the messages built by ``build`` (``rmqpy``'s ``Message``s, say), straight from
        the records (``codec.pull_objects``): no encode and decode between; the reply's ``messages``
        stays empty."""
        if max_messages < 1 or offset < 0:
            raise RequestError(ErrorCode.INVALID_FIELD, "max_messages must be at least 1 and offset not negative")
        deadline = time.monotonic() + max_wait_ms / 1000
        matching = Subscription(subscription)
        while True:
            result = self._pull_once(topic, queue_id, offset, max_messages, max_bytes, matching, build)
            if result.message_count or result.status not in NOTHING_YET or not self._wait(topic, queue_id, deadline):
                break
        if result.corrupt_offset >= 0 and not result.message_count:
            raise RequestError(ErrorCode.MESSAGE_CORRUPT, f"the message at queue offset {result.corrupt_offset} is "
                                                          f"damaged and is not served; the next offset is "
                                                          f"{result.next_offset}", next_offset=result.next_offset)
        reply = PullReply(ok=True, status=result.status.name, status_code=int(result.status),
                          next_offset=result.next_offset, min_offset=result.min_offset, max_offset=result.max_offset)
        return reply, result.built

    def _pull_once(self, topic: str, queue_id: int, offset: int, max_messages: int, max_bytes: int | None,
                   matching: Subscription, build: Build) -> PullResult:
        self._follow()
        cq = self._queue(topic, queue_id, offset)
        visible_end, written_end = self.visible_end(), self.slots.get(CONFIRMED)
        result = pull(cq, self.reader, offset=offset, visible_end=visible_end, written_end=written_end,
                      subscription=matching, max_messages=min(max_messages, self.config.pull_message_count_max),
                      max_bytes=min(max_bytes or self.config.pull_bytes_max, self.config.pull_bytes_max), build=build)
        if result.suspect_offset >= 0 and not result.message_count:
            # A unit the owner is writing now, or one it will heal: nothing to serve from here yet.
            result.status, result.next_offset = GetStatus.OFFSET_OVERFLOW_ONE, result.suspect_offset
        return result

    def _wait(self, topic: str, queue_id: int, deadline: float) -> bool:
        return self.wait_for_new(topic, [queue_id], deadline)

    def wait_for_new(self, topic: str, queue_ids: Iterable[int], deadline: float) -> bool:
        """Wait for the log to grow (a ``Wake`` on ``confirmed``) and the owners of the queues to
        apply it; False once ``deadline`` (``time.monotonic``) passed."""
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            return False
        wakes = self._wake_socket()
        confirmed = self.slots.get(CONFIRMED)
        if wakes.poll(min(remaining_ms, 100)):  # the writer also wakes every tick: a lost Wake costs 100 ms
            while wakes.poll(0):
                wakes.recv_multipart()
        target = max(confirmed, self.slots.get(CONFIRMED))
        owners = self.config.consume_queue_owner_count
        slots = {owner_slot(owner_of(topic, queue_id, owners)) for queue_id in queue_ids}
        while any(self.slots.get(slot) < target for slot in slots) and time.monotonic() < deadline:
            time.sleep(_APPLY_POLL_S)  # the owners apply within a dispatch turn
        return time.monotonic() < deadline

    def _wake_socket(self) -> zmq.Socket[bytes]:
        if self._wakes is None:
            self._zmq = zmq.Context()
            sock = endpoints.configure(self._zmq.socket(zmq.SUB), hwm=16)
            sock.setsockopt(zmq.SUBSCRIBE, endpoints.TOPIC_CONFIRMED)
            sock.connect(endpoints.ipc(self.run_dir, channels.CONFIRMED.endpoint))
            self._wakes = sock
        return self._wakes

    # -- lookups --------------------------------------------------------------------------------

    def query_by_key(self, topic: str, key: str, *, max_results: int = 32, begin_timestamp: int = 0,
                     end_timestamp: int = 2**63 - 1) -> list[dict[str, Any]]:
        """The messages of ``topic`` with ``key``, oldest first, as ``query_by_key`` answers them."""
        self._follow()  # first: a new start of the engine lets the lookup's mappings go
        if self._lookup is None:
            self._lookup = KeyLookup(self.store_dir, self.config)
        if self.log_min != self._lookup.reader.min_offset():
            self._lookup.after_retention()
        return self._lookup.find(topic, key, max_results=max_results, begin_ms=begin_timestamp,
                                 end_ms=end_timestamp, visible_end=self.visible_end(), deletions=self.deletions)

    def get_by_offset(self, commit_log_offset: int) -> dict[str, Any]:
        """The record at ``commit_log_offset``; RequestError MESSAGE_NOT_FOUND or MESSAGE_CORRUPT as the op gives."""
        self._follow()
        view, deleted = read_record(self.reader, self.deleted_topics, commit_log_offset,
                                    visible_end=self.visible_end())
        if deleted:
            view["deleted_topic"] = True
        return view

    def get_by_id(self, msg_id: str) -> dict[str, Any]:
        return self.get_by_offset(msg_id_offset(msg_id))

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
        self.queues.clear()
        self.reader.segments.close()
        if self._lookup is not None:
            self._lookup.close()
        if self._zmq is not None:
            self._zmq.destroy(linger=0)
        self.slots.close()

    def __enter__(self) -> LocalReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
