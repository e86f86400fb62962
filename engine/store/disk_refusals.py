"""What an actor does when the disk refuses a write: refuse, log, count, retry later.

A full disk (ENOSPC, EDQUOT) or a write that fails with EIO must not end an actor: the
supervisor would restart it into the same full disk, again and again, and whatever it
serves (delayed messages, pops, transactions) would stop. The actor keeps serving what
needs no new blocks, answers what does with DISK_FULL, and tries the write again later.

Not covered here: a failed fsync or msync of data already written (``sync.FlushError``),
which stops the actor (docs/design.md 6.3; after a failed fsync Linux may have dropped the
dirty pages, so a retry could succeed without the data). A refused fallocate, write or
whole-file replacement (a new file each time) is safe to retry.
"""

from __future__ import annotations

import errno
import logging

from engine.store.sync import FlushError

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})

log = logging.getLogger(__name__)


def is_disk_refusal(exc: OSError) -> bool:
    return exc.errno in DISK_ERRNOS


class DiskRefusals:
    """Counts refused writes of one kind; logs the first of an episode and its end, not each retry."""

    __slots__ = ("count", "refusing", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.count = 0
        self.refusing = False

    def refused(self, exc: OSError) -> None:
        """Note a refusal; ``exc`` itself again if it is not the disk's (a bug, or a lost directory)."""
        if not is_disk_refusal(exc) or isinstance(exc, FlushError):
            raise exc
        self.count += 1
        if not self.refusing:
            self.refusing = True
            log.error("%s: the disk refused a write (%s); retrying until it takes it", self.what, exc)

    def written(self) -> None:
        if self.refusing:
            self.refusing = False
            log.warning("%s: the disk takes writes again (%d refused)", self.what, self.count)
