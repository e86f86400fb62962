"""Flushing files from a background thread, so an actor's loop never waits for the disk.

Under heavy writing the kernel's writeback of the log can keep the disk busy
for seconds; an msync from an actor's loop would then stall its pulls and
dispatches for as long. The actor marks the files it dirtied; every
``request`` hands the marked set, with the offset it makes durable, to the
thread, which ``fdatasync``s each file (the call releases the GIL) and then
reports the offset through ``on_durable``.

A failed flush is kept for the next request, unless the actor passed ``on_failure``: then
it is told why, and the thread takes no more work (fsyncgate: the commit-log writer,
which syncs its own appends under SYNC_FLUSH, never retries a failed flush).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from engine.store import sync

log = logging.getLogger(__name__)


class FileSyncer:
    """The runtime's ``sync.Syncer``: a thread per actor that fdatasyncs the marked files."""

    def __init__(self, name: str, on_durable: Callable[[int], None], *,
                 on_failure: Callable[[str], None] | None = None) -> None:
        self.on_durable = on_durable
        self.on_failure = on_failure
        self.dirty: set[Path] = set()
        self._pending: tuple[set[Path], int] | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name=f"{name}-syncer", daemon=True)
        self._thread.start()

    def mark(self, path: Path) -> None:
        with self._lock:
            self.dirty.add(path)

    def request(self, durable_offset: int) -> None:
        """Make the marked files durable in the background, then report ``durable_offset``."""
        with self._lock:
            if self._pending is not None:
                self._pending[0].update(self.dirty)
                self._pending = (self._pending[0], durable_offset)
            else:
                self._pending = (self.dirty, durable_offset)
            self.dirty = set()
            self._idle.clear()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                work, self._pending = self._pending, None
            if work is not None:
                paths, offset = work
                reasons: list[str] = []
                failed = [path for path in sorted(paths) if not _fdatasync(path, reasons)]
                if failed and self.on_failure is not None:
                    self.on_failure(reasons[0])
                    self._idle.set()
                    return
                if failed:
                    # Not durable: the offset is not reported, so the checkpoint keeps its older
                    # dispatched offset and recovery re-applies the log from there.
                    with self._lock:
                        self.dirty.update(failed)
                else:
                    self.on_durable(offset)
            with self._lock:
                if self._pending is None:
                    self._idle.set()
            if self._stop:
                return

    def sync_here(self, durable_offset: int) -> bool:
        """Sync the marked files in the caller's thread and report ``durable_offset``, when the thread
        has nothing to do (True); False, nothing done, while it syncs or has work waiting: then
        ``request``. For an actor whose loop would only wait for this sync anyway (the writer with
        one run of sends to make durable), it saves the hand-over to the thread and the wake-up back."""
        with self._lock:
            if self._pending is not None or not self._idle.is_set():
                return False
            paths, self.dirty = self.dirty, set()
        reasons: list[str] = []
        failed = [path for path in sorted(paths) if not _fdatasync(path, reasons)]
        if failed and self.on_failure is not None:
            self.close_after_failure()
            self.on_failure(reasons[0])
        elif failed:
            with self._lock:
                self.dirty.update(failed)
        else:
            self.on_durable(durable_offset)
        return True

    def close_after_failure(self) -> None:
        """A failed flush told to ``on_failure``: the thread takes no more work, as after its own."""
        self._stop = True
        with self._lock:
            self._pending = None
        self._wake.set()

    def flush_now(self, durable_offset: int, *, timeout_s: float = 5.0) -> None:
        """Request a flush and wait until it is done (at shutdown and after recovery)."""
        self.request(durable_offset)
        self._idle.wait(timeout_s)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(10)


def _fdatasync(path: Path, reasons: list[str]) -> bool:
    """True when the file is on disk (or gone: deleted meanwhile by retention or repair); else
    the reason goes into ``reasons``."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        sync.fdatasync(fd, path)
    except OSError as exc:
        log.error("cannot flush %s: %s", path, exc)
        reasons.append(str(exc))
        return False
    finally:
        os.close(fd)
    return True
