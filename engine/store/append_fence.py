"""A replica's fence between its writer's appends and a look at its log from outside.

When a replica follows a new master, the supervisor decides whether its log forks from the new
master's (then it is cut, every actor stopped) or not (then only the replication receiver starts
again, and the other actors keep running). Chunks of the old follow may still be on their way to
the writer when it looks. The writer appends a chunk only while it holds this lock and the chunk's
epoch is the engine's (the membership actor sets the epoch before the supervisor hears of the new
role); the supervisor looks while it holds it. So every chunk of an older epoch is either in the
log when it looks, or refused::

    writer:      lock, epoch of the chunk == the epoch slot?, append, unlock
    supervisor:  (epoch slot set already) lock, read the log's end, unlock
    membership:  lock, epoch slot := the epoch it claims, read the log's end, unlock, claim

The membership actor of a replica that wins an election takes it too: the end it claims the new
epoch at (the epoch's start in the set's history) is then the end of every byte the old master's
follow brought, and none of the old epoch lands past it. (The test bed's nemesis found such bytes
under a planted master that acknowledged past its lease: counted as the new epoch's.)

``flock`` on a file of the run directory: the kernel lets it go with a killed holder.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class AppendFence:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    @contextmanager
    def held(self) -> Iterator[None]:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)
