"""Where each actor starts again after a crash: the store's cross-actor invariant, in one place.

Every offset here is a CommitLog offset (bytes). While the engine runs:

    log_min <= checkpoint.dispatched <= durable(r) <= applied(r) <= confirmed      for every receiver r
    checkpoint.flushed <= flushed <= confirmed

where a *receiver* is a ConsumeQueue owner or the index builder, ``applied(r)`` is how
far it has put the log into its files, and ``durable(r)`` how far those files are
flushed (each receiver publishes both in the shared offsets). Recovery rests on three
facts that the writers of the files keep:

I1. A receiver's files hold every entry of [log_min, durable(r)) on disk. The flusher
    writes ``checkpoint.dispatched = min over r of durable(r)`` (never lowered), so after
    any crash every receiver holds everything below ``checkpoint.dispatched``.
I2. A ConsumeQueue is written in log order: it holds every record of its queue below the
    end of the record its last unit points at (``queue end``), unless recovery had to drop
    torn units from its tail; then it is complete only up to its new last unit.
I3. The log is on disk below ``checkpoint.flushed``, a record boundary.

A receiver's *restart point* is the smallest offset below which I1 and I2 prove its files
complete; it applies the log again from there (puts are idempotent by queue offset; an
index item added twice is harmless), never from below ``log_min`` (retention took it) and
never past ``confirmed`` (the recovered end of the log). The functions below compute
every restart point and assert these bounds; the actors only call them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueTail:
    """What recovery found at the end of one ConsumeQueue."""

    end: int  # end of the record its last unit points at (0 for an empty queue)
    dropped: bool  # recovery dropped torn units from its tail


def _clamp(point: int, log_min: int, confirmed: int) -> int:
    restart = max(log_min, min(point, confirmed))
    assert log_min <= restart <= max(log_min, confirmed), (point, log_min, confirmed)
    return restart


def queue_safe_point(tail: QueueTail, dispatched: int) -> int:
    """Below this a queue holds every record of its own (I1 and I2)."""
    return tail.end if tail.dropped else max(dispatched, tail.end)


def dispatched_on_disk(dispatched: int, *, queues_on_disk: int, log_min: int) -> int:
    """The checkpoint's dispatched offset, as far as the ConsumeQueues on disk bear it out (I1).

    No queue at all while the checkpoint says records below it were dispatched: the
    ``consumequeue`` directory was lost (deleted while the engine was stopped). Every queue is
    then built again from the start of the log, and the writer's recovery scans the log from
    there for every queue's next offset, as RocketMQ's recovery dispatches again from the
    greatest end of its queues (none: the first file)."""
    if queues_on_disk == 0 and dispatched > log_min:
        return log_min
    return dispatched


def commit_log_scan_start(*, log_min: int, dispatched: int, flushed: int) -> int:
    """Where the writer's recovery scans from: early enough to find the next offset of every queue,
    and to check every byte a power cut may have lost (I3).

    Not past the checkpoint's dispatched offset, even when every queue on disk holds more: a
    queue whose first records were not dispatched yet has no directory, and only the log knows
    its offsets (I1 says nothing of it below its first unit)."""
    start = max(log_min, min(dispatched, flushed))
    assert start <= max(log_min, flushed) and start <= max(log_min, dispatched)
    return start


def owner_restart(tails: Iterable[QueueTail], *, dispatched: int, log_min: int, confirmed: int) -> int:
    """A ConsumeQueue owner applies again from the smallest safe point of its queues."""
    return _clamp(min((queue_safe_point(tail, dispatched) for tail in tails), default=dispatched),
                  log_min, confirmed)


def owner_restart_unclean(*, dispatched: int, log_min: int, confirmed: int) -> int:
    """After an unclean stop I2 no longer holds: a power cut loses unflushed units in any file, in
    any order. Every queue is cut back below the dispatched offset (I1), and the owner applies the
    log again from there."""
    return _clamp(dispatched, log_min, confirmed)


def index_restart(index_end: int, *, dispatched: int, log_min: int, confirmed: int) -> int:
    """The index builder applies again from past what its newest IndexFile already holds (I1)."""
    return _clamp(max(dispatched, index_end), log_min, confirmed)


def index_restart_unclean(kept_end: int, *, log_min: int, confirmed: int) -> int:
    """After an unclean stop the newest IndexFiles are deleted (their items past the durable point
    may be lost or torn); the index builder indexes again from the end of the files it kept."""
    return _clamp(kept_end, log_min, confirmed)


def reput_restart(applied: Iterable[int], *, dispatched: int, log_min: int) -> int:
    """The dispatcher starts at the least progress of its receivers (all of them restart at or
    after it), or at the checkpoint when none has published any yet (the whole engine restarted).

    Starting early is harmless: receivers skip what they already hold."""
    least = min(applied, default=0)
    restart = max(log_min, least if least > 0 else dispatched)
    assert restart >= log_min
    return restart


def flusher_restart(checkpoint_flushed: int, confirmed: int) -> int:
    """The flusher trusts only what the checkpoint says was flushed, and flushes the rest at once."""
    restart = min(checkpoint_flushed, confirmed)
    assert 0 <= restart <= confirmed or confirmed == 0
    return restart


def checkpoint_within_log(dispatched: int, confirmed: int) -> int:
    """At the flusher's restart: under ASYNC_FLUSH receivers apply (and flush) what the log has not
    flushed yet, so a power cut can take the log's tail below the checkpoint's dispatched offset.
    The checkpoint then follows the log down, before any receiver reads it: past the new end, new
    records will take those offsets, and nothing holds them yet."""
    return min(dispatched, confirmed)


def checkpoint_dispatched(durable: Iterable[int], previous: int) -> int:
    """The checkpoint's dispatched offset: what every receiver holds on disk (I1); never lowered."""
    return max(previous, min(durable))
