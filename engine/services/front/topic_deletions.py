"""The deletions of topics the front forwarded to the writer and has not heard back about.

A ``delete_topic`` goes to the writer, which records where the deletion falls in the log
(``engine/actors/commit_log_writer.py``); until its answer the topic is "being deleted":
requests naming it are refused, ``list_topics`` leaves it out, a ``create_topic`` of it is
BUSY. The protocol kept here:

* ``add`` when a deletion is forwarded; ``answered`` when the writer's answer comes (it is
  then no longer pending); ``forget`` when the writer could not take it (down or busy);
* a writer that restarts with deletions unanswered may have recorded them or not: they are
  sent again, as they came (``writer_connected`` marks them due, ``to_send_again`` hands
  them out). A deletion recorded twice deletes nothing more the second time: the front sent
  nothing for the topic in between, and the writer takes its requests in order;
* the second answer to a deletion sent twice finds nothing pending (``answered`` is False)
  and is dropped: its client has the first.

Called by the front (``engine/actors/front.py``), which forwards the deletions and relays
the answers; ``TopicRules`` asks it which topics are being deleted (``in``).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from engine.ipc.wire import Origin

log = logging.getLogger(__name__)


class PendingDeletion(NamedTuple):
    """A ``delete_topic`` forwarded to the writer and not answered yet: sent again, as it came,
    if the writer restarts before answering it."""

    origin: Origin
    raw: bytes


class TopicDeletions:
    """The deletions forwarded to the writer and not yet answered, by topic."""

    def __init__(self) -> None:
        self.pending: dict[str, list[PendingDeletion]] = {}
        self.send_again_due = False  # the writer restarted with deletions unanswered: send them again

    def __contains__(self, topic: object) -> bool:
        """Is ``topic`` being deleted?"""
        return topic in self.pending

    def add(self, topic: str, origin: Origin, raw: bytes) -> PendingDeletion:
        pending = PendingDeletion(origin, raw)
        self.pending.setdefault(topic, []).append(pending)
        return pending

    def answered(self, topic: str, origin: Origin) -> bool:
        """The writer answered a deletion of ``topic`` for ``origin``: it is no longer pending. False
        when none is (the answer to a deletion sent twice, whose first answer came)."""
        for pending in self.pending.get(topic, ()):
            if pending.origin == origin:
                self.forget(topic, pending)
                return True
        return False

    def forget(self, topic: str, pending: PendingDeletion) -> None:
        waiting = self.pending.get(topic, [])
        if pending in waiting:
            waiting.remove(pending)
        if not waiting:
            self.pending.pop(topic, None)

    def writer_connected(self) -> None:
        """A new writer: what the old one took and did not answer may be lost."""
        if self.pending:
            self.send_again_due = True

    def to_send_again(self) -> list[tuple[str, PendingDeletion]]:
        """After a writer restart, the deletions it had not answered: the topic stays "being
        deleted" until one of them is answered."""
        self.send_again_due = False
        again = []
        for topic, waiting in self.pending.items():
            log.warning("the writer restarted before answering %d deletion(s) of %r: sent again", len(waiting), topic)
            again += [(topic, pending) for pending in waiting]
        return again

    def send_again_refused(self) -> None:
        """The writer is down or busy again: the deletions go at a later tick."""
        self.send_again_due = True
