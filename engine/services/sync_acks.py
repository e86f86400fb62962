"""The sends that wait for the flush (SYNC_FLUSH): answered once the log is flushed past them.

Under SYNC_FLUSH a send with ``wait_store`` is answered once the flusher reports the log
flushed past its batch (group commit: one flush covers every waiting batch), or
FLUSH_DISK_TIMEOUT after ``sync_flush_timeout_ms``. Batches wait in log order, so the
flushed offset and the deadlines release them from the front of the queue. A flush that
fails answers every waiting send FLUSH_FAILED: nothing past a failed flush is ever
acknowledged (fsyncgate).

Called by the writer (``engine/actors/commit_log_writer.py``): ``wait`` for a stored send
that must wait, ``release`` when the flusher reports progress and each tick, ``fail`` when
the flusher reports a failed flush.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from engine.errors import PutStatus
from engine.ipc.wire import Origin
from engine.services.log_appends import Stored


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

    def release(self, flushed_offset: int, now_ms: int) -> Iterator[tuple[PendingAck, PutStatus]]:
        """The sends now answered, each with its status: PUT_OK when the log is flushed past it,
        FLUSH_DISK_TIMEOUT when its deadline passed first."""
        while self.pending and (self.pending[0].end_offset <= flushed_offset
                                or self.pending[0].deadline_ms <= now_ms):
            ack = self.pending.popleft()
            yield ack, PutStatus.PUT_OK if ack.end_offset <= flushed_offset else PutStatus.FLUSH_DISK_TIMEOUT

    def fail(self) -> list[PendingAck]:
        """A flush failed: every waiting send, to be refused."""
        failed = list(self.pending)
        self.pending.clear()
        return failed
