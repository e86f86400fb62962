"""The sends that wait for the flush (SYNC_FLUSH) or the replicas (SYNC replication): answered once
the log is flushed past them and the in-sync replicas hold them.

Under SYNC_FLUSH a send with ``wait_store`` is answered once the flusher reports the log
flushed past its batch (group commit: one flush covers every waiting batch), or
FLUSH_DISK_TIMEOUT after ``sync_flush_timeout_ms``. Batches wait in log order, so the
flushed offset and the deadlines release them from the front of the queue. A flush that
fails answers every waiting send FLUSH_FAILED: nothing past a failed flush is ever
acknowledged (fsyncgate).

Called by the writer (``engine/actors/commit_log_writer.py``): ``wait`` for a stored send
that must wait, ``release`` when its own sync (``OwnSync``) reports progress and each tick,
``fail`` when a flush failed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.errors import PutStatus
from engine.ipc.wire import Origin
from engine.services.writer.log_appends import Stored
from engine.store.sync import SyncerFactory


@dataclass
class PendingAck:
    """A batch waiting for the flusher (SYNC_FLUSH)."""

    reply_to: Origin
    request_id: int
    end_offset: int
    deadline_ms: int
    stored: Stored
    received_ms: int  # when the front took the send (0: not known), for the latency histogram


class SyncAcks:
    """The waiting sends, in log order."""

    def __init__(self) -> None:
        self.pending: deque[PendingAck] = deque()

    def __len__(self) -> int:
        return len(self.pending)

    def wait(self, ack: PendingAck) -> None:
        self.pending.append(ack)

    def release(self, flushed_offset: int, now_ms: int,
                replicated_offset: int | None = None) -> Iterator[tuple[PendingAck, PutStatus]]:
        """The sends now answered, each with its status: PUT_OK when the log is flushed past it (and,
        with a ``replicated_offset``: SYNC replication, every in-sync replica holds it), else, once
        its deadline passed, FLUSH_DISK_TIMEOUT (not flushed) or FLUSH_SLAVE_TIMEOUT (not replicated)."""
        done = flushed_offset if replicated_offset is None else min(flushed_offset, replicated_offset)
        while self.pending and (self.pending[0].end_offset <= done or self.pending[0].deadline_ms <= now_ms):
            ack = self.pending.popleft()
            if ack.end_offset <= done:
                yield ack, PutStatus.PUT_OK
            elif ack.end_offset > flushed_offset:
                yield ack, PutStatus.FLUSH_DISK_TIMEOUT
            else:
                yield ack, PutStatus.FLUSH_SLAVE_TIMEOUT

    def fail(self) -> list[PendingAck]:
        """A flush failed: every waiting send, to be refused."""
        failed = list(self.pending)
        self.pending.clear()
        return failed


class OwnSync:
    """The writer's own sync of its appends under SYNC_FLUSH (one wake-up per durable send, none
    for a sync made in the loop).

    After each run of appends the writer hands the segments they touched, and the offset they
    reach, to its flush thread (``FileSyncer``, or the simulation's); the thread fdatasyncs them,
    sets ``synced`` (or ``failure``) and wakes the writer's loop (``wake``: the runtime's
    ``Waker.wake``), which then publishes the flushed offset and answers the sends it covers. A
    stalled disk stalls the thread, not the loop: the sends' deadlines answer FLUSH_DISK_TIMEOUT
    meanwhile. When the thread is idle and syncs are quick, the loop makes the sync itself
    (``request``'s ``in_loop_ms_max``): nothing else waits, and the hand-over and the wake-up cost
    as much as a third of the sync.
    ``timed`` is told, from the thread, each wait for a sync: from handing the oldest
    unsynced run to the thread to the sync that covered it, in seconds (the writer's
    ``rmqpy_flush_seconds``; a figure is the actor's to report, not this object's)."""

    def __init__(self, syncer: SyncerFactory, wake: Callable[[], None], name: str,
                 segment_path: Callable[[int], Path], segment_size_bytes: int,
                 timed: Callable[[float], None], mono_ms: Callable[[], int]) -> None:
        self.wake = wake
        self.mono_ms = mono_ms  # the actor's clock (the simulation's in the simulation): the last wait's measure
        self.timed = timed
        self.segment_path = segment_path
        self.segment_size_bytes = segment_size_bytes
        self.requested = 0  # the offset the last request makes durable
        self.synced = 0  # written by the thread: the log is on disk up to here
        self.failure: str | None = None  # written by the thread: why a flush failed
        # perf_counter seconds when the oldest unsynced run went to the thread (None: all requested is synced)
        self._waiting_since: float | None = None
        self._waiting_since_ms = 0  # the same, on the actor's clock
        self._in_loop = False  # a sync made in the writer's loop: no wake-up of the loop for it
        self.last_wait_ms = 0  # the last wait for a sync, on the actor's clock (see ``request``)
        self.syncer = syncer(name, self._durable, on_failure=self._failed)

    def _durable(self, offset: int) -> None:  # the flush thread, or the loop (``in_loop``)
        since = self._waiting_since
        self.synced = offset
        if offset >= self.requested:
            self._waiting_since = None
        if since is not None:
            self.last_wait_ms = self.mono_ms() - self._waiting_since_ms
            self.timed(time.perf_counter() - since)
        if not self._in_loop:
            self.wake()

    def _failed(self, reason: str) -> None:  # the flush thread, or the loop (``in_loop``)
        self.failure = reason
        if not self._in_loop:
            self.wake()

    def request(self, end: int, *, in_loop_ms_max: float = -1) -> bool:
        """Make the log durable up to ``end``: the segments from the last request's end on.
        ``in_loop_ms_max``: sync them in the caller's thread if the flush thread is idle (nothing
        else waits: the loop would only wait for this sync) and the last wait for a sync took at most
        this long (a disk that stalls then stalls the thread, and the loop goes on answering and
        timing the sends out, until a sync is quick again). True when that sync was made here, done
        or failed (``synced``, ``failure``): the caller then does what the thread's wake-up would."""
        if not self._mark_to(end):
            return False
        if self._waiting_since is None:
            self._waiting_since = time.perf_counter()
            self._waiting_since_ms = self.mono_ms()
        if self.last_wait_ms <= in_loop_ms_max:
            self._in_loop = True
            try:
                if self.syncer.sync_here(end):
                    return True
            finally:
                self._in_loop = False
        self.syncer.request(end)
        return False

    def recover(self, durable: int, end: int) -> None:
        """At the writer's start: what lies between the last known durable offset and the
        recovered end may be only in the page cache (a killed writer); sync it before serving."""
        self.requested = self.synced = min(durable, end)
        if self._mark_to(end):
            self.syncer.flush_now(end)

    def _mark_to(self, end: int) -> bool:
        """Mark the segments from the last request's end up to ``end``; False if nothing is new."""
        if end <= self.requested:
            return False
        size = self.segment_size_bytes
        for start in range(self.requested - self.requested % size, end, size):
            self.syncer.mark(self.segment_path(start))
        self.requested = end
        return True

    def close(self) -> None:
        self.syncer.close()
