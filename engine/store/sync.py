"""Making data files durable: every fsync, fdatasync and msync of the log, the queues and the index.

They all go through here, so that one place knows which bytes are on disk: the
simulation (``harness/simulation/disk.py``) listens to learn what a power cut may
not take away. Files replaced whole (the checkpoint, the JSON tables) are written
with ``atomic_file`` and are not reported.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

# path, start, end of the range now on disk (end None: the whole file)
SyncListener = Callable[[Path, int, int | None], None]
_listener: SyncListener | None = None


def listen(listener: SyncListener | None) -> None:
    """Report every sync to ``listener`` from now on (None: stop)."""
    global _listener  # noqa: PLW0603 - one listener for the process, set by the simulation
    _listener = listener


def created(path: Path) -> None:
    """``path`` was just created whole and synced, under this name."""
    if _listener is not None:
        _listener(path, 0, None)


class FlushError(OSError):
    """An fdatasync or msync failed: the bytes it covered may be lost even if a retry succeeds
    (Linux may mark the failed pages clean), so no caller retries one (docs/design.md 6.3)."""


def fdatasync(fd: int, path: Path) -> None:
    try:
        os.fdatasync(fd)
    except OSError as exc:
        raise FlushError(exc.errno, f"fdatasync of {path}: {exc.strerror}") from exc
    if _listener is not None:
        _listener(path, 0, None)


def msync(mm: mmap.mmap, start: int, length: int, path: Path) -> None:
    try:
        mm.flush(start, length)
    except OSError as exc:
        raise FlushError(exc.errno, f"msync of {path}: {exc.strerror}") from exc
    if _listener is not None:
        _listener(path, start, start + length)


class Syncer(Protocol):
    """What an actor asks of its flush thread (``engine/actors/file_syncer.py``; the simulation
    gives it one without a thread): the files to sync, and the offset they make durable."""

    def mark(self, path: Path) -> None: ...
    def request(self, durable_offset: int) -> None: ...
    def sync_here(self, durable_offset: int) -> bool: ...
    def flush_now(self, durable_offset: int) -> None: ...
    def close(self) -> None: ...


class SyncerFactory(Protocol):
    """How an actor gets its flush thread (``FileSyncer``; the simulation's runs at its steps):
    ``on_durable`` is called with each offset made durable, ``on_failure`` (when given) with the
    reason a flush failed, after which the syncer takes no more work. Declared here, beside the
    syncs, so that the writer's service (``engine/services/writer/sync_acks.py``) names it without the runtime."""

    def __call__(self, name: str, on_durable: Callable[[int], None], *,
                 on_failure: Callable[[str], None] | None = None) -> Syncer: ...
