"""Making data files durable: every fsync, fdatasync and msync of the log, the queues and the index.

They all go through here, so that one place knows which bytes are on disk: the
simulation (``engine/simulation/disk.py``) listens to learn what a power cut may
not take away. Files replaced whole (the checkpoint, the JSON tables) are written
with ``atomic_file`` and are not reported.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from pathlib import Path

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


def fdatasync(fd: int, path: Path) -> None:
    os.fdatasync(fd)
    if _listener is not None:
        _listener(path, 0, None)


def msync(mm: mmap.mmap, start: int, length: int, path: Path) -> None:
    mm.flush(start, length)
    if _listener is not None:
        _listener(path, start, start + length)
