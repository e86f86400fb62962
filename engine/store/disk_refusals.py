"""What an actor does when the disk refuses a write: refuse, log, count, retry later.

A full disk (ENOSPC, EDQUOT) or a write that fails with EIO must not end an actor: the
supervisor would restart it into the same full disk, again and again, and whatever it
serves (delayed messages, pops, transactions) would stop. The actor keeps serving what
needs no new blocks, answers what does with DISK_FULL, and tries the write again later.

Not covered here: a failed fsync or msync of data already written (``sync.FlushError``),
which stops the actor (docs/design.md 6.3; after a failed fsync Linux may have dropped the
dirty pages, so a retry could succeed without the data). A refused fallocate, write or
whole-file replacement (a new file each time) is safe to retry.

While an episode lasts, ``condition`` says so in the actor's heartbeat, and the supervisor
reports the engine DEGRADED with it (docs/operations.md, "DEGRADED").
"""

from __future__ import annotations

import errno
import logging

from engine.logs import event
from engine.store.sync import FlushError

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})

log = logging.getLogger(__name__)


def is_disk_refusal(exc: OSError) -> bool:
    return exc.errno in DISK_ERRNOS


class DiskRefusals:
    """Counts refused writes of one kind; logs the first of an episode and its end, not each retry."""

    __slots__ = ("count", "errnos", "event_kind", "reason", "refusing", "what")

    def __init__(self, what: str, *, errnos: frozenset[int] | None = DISK_ERRNOS, event_kind: str = "") -> None:
        """``errnos``: the errors refused and retried (None: every OSError); others are raised again.
        ``event_kind``: the event the first refusal of an episode is logged as (docs/operations.md)."""
        self.what = what
        self.event_kind = event_kind
        self.errnos = errnos
        self.count = 0
        self.refusing = False
        self.reason = ""  # the last refusal's error, in the words of ``condition``

    def refused(self, exc: OSError, reason: str = "") -> None:
        """Note a refusal (``reason``: what the condition says, by default the error's text);
        ``exc`` itself again if it is not the disk's (a bug, or a lost directory)."""
        if (self.errnos is not None and exc.errno not in self.errnos) or isinstance(exc, FlushError):
            raise exc
        self.count += 1
        self.reason = reason or (exc.strerror or str(exc)).lower()
        if not self.refusing:
            self.refusing = True
            log.error("%s: the disk refused a write (%s); retrying until it takes it", self.what, exc,
                      extra=event(self.event_kind, reason=str(exc)) if self.event_kind else None)

    def written(self) -> None:
        if self.refusing:
            self.refusing = False
            self.reason = ""
            log.warning("%s: the disk takes writes again (%d refused)", self.what, self.count)

    def condition(self) -> str:
        """For ``Actor.condition``: "" unless the disk refuses writes now."""
        return f"cannot write its files: {self.reason}" if self.refusing else ""
