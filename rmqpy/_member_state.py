"""``MemberState``: a group member's side of sharing a topic's queues, with no I/O and no clock.

``GroupMember`` (``rmqpy/_group_member.py``) drives it with a socket and ``time.monotonic``; the
seeded simulation (``harness/group_simulation.py``) drives the same object with its own clock,
lost heartbeats and a front that restarts. It keeps:

* the last heartbeat reply (``View``): the live members, the queues granted, the queue count,
  whether the engine has settled, and when the heartbeat that brought it was *sent*: the
  member's session at the engine began no earlier, so the member counts itself dead (stale)
  no later than the engine does;
* what the next heartbeat says: the queues wanted (the target) and those read now (held).

``share(held, now)`` says what to read: the target's queues that the engine granted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rmqpy._allocation import allocate_averagely

PENDING_BEAT_S = 0.2  # how often a member beats while a queue of its share is not granted yet


@dataclass
class View:
    members: tuple[str, ...]
    granted: tuple[int, ...]
    queue_count: int
    settled: bool
    session_ms: int
    at: float  # seconds: when the heartbeat that brought this reply was sent

    def same(self, other: View) -> bool:
        return (self.members, self.granted, self.queue_count, self.settled) == (
            other.members, other.granted, other.queue_count, other.settled)

    def stale(self, now: float) -> bool:
        return now - self.at >= self.session_ms / 1000


class MemberState:
    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.view: View | None = None
        self.wanted: tuple[int, ...] = ()  # the queues the next heartbeat asks for
        self.held: tuple[int, ...] = ()  # the queues the consumer reads now, as the next heartbeat says
        self.sent = 0  # heartbeats made so far: ``request`` numbers them, ``on_reply`` takes the number back
        self._released: dict[int, int] = {}  # queue -> the first heartbeat that lets it go
        self._asked: tuple[View, bool] | None = None  # the view ``share`` last answered from, and if stale

    def request(self, now: float, *, leaving: bool = False) -> dict[str, Any]:
        """The heartbeat's fields besides group and topic. ``held`` names only the queues read now that
        the last reply still granted: a member whose session it counts as ended holds nothing, and a
        queue the engine took back is being let go (the engine may have given it to another, and a
        front that just started would give it back otherwise)."""
        view = self.view
        held = [] if view is None or view.stale(now) else [q for q in self.held if q in view.granted]
        self.sent += 1
        return {"client_id": self.client_id, "queues": list(self.wanted), "held": held, "seq": self.sent,
                "leaving": leaving}

    def on_reply(self, reply: dict[str, Any], sent_at: float, now: float, number: int) -> None:
        """The reply to heartbeat ``number`` (``sent``, as ``request`` left it), sent at ``sent_at``.
        A reply that changes nothing only refreshes the view (so ``share`` stays cheap). A queue it
        grants that a later heartbeat lets go is not granted (replies may come late or out of
        order), and a reply to a heartbeat sent before the member's session ended and received
        after is dropped: that heartbeat may have claimed again, at a front that just started,
        queues others read since."""
        if self.view is not None and self.view.stale(now) and not self.view.stale(sent_at):
            return
        granted = tuple(q for q in reply["granted"] if self._released.get(q, 0) <= number)
        view = View(tuple(reply["members"]), granted, reply["queue_count"], reply["settled"],
                    reply["session_timeout_ms"], sent_at)
        if self.view is not None and view.same(self.view):
            self.view.at = max(self.view.at, sent_at)
        elif self.view is None or sent_at >= self.view.at:
            self.view = view  # a new object: the consumer's next look rebalances

    def interval_s(self) -> float:
        """How long until the next heartbeat: a third of the session, or ``PENDING_BEAT_S`` while
        a wanted queue is not granted yet."""
        assert self.view is not None
        pending = not set(self.wanted) <= set(self.view.granted)
        return PENDING_BEAT_S if pending else self.view.session_ms / 3000

    def changed(self, now: float) -> bool:
        """Whether ``share`` would answer something now: a new view, or the one it answered from
        gone stale. Cheap (two comparisons): the consumer asks between every two messages."""
        view, asked = self.view, self._asked
        return asked is None or asked[0] is not view or (not asked[1] and view is not None and view.stale(now))

    def share(self, held: Sequence[int], now: float) -> tuple[list[int], list[int]] | None:
        """None if nothing changed since the last call; else (the queues to read now, the target).
        The queues to read are the target's that the engine granted; the target is to be asked for
        (``want``) once the queues left out are let go."""
        view = self.view
        assert view is not None
        stale = view.stale(now)
        if self._asked is not None and self._asked[0] is view and self._asked[1] == stale:
            return None
        self._asked = (view, stale)
        target = self.target(view, stale, held)
        return [q for q in target if q in view.granted], target

    def keeps(self, held: Sequence[int], now: float) -> list[int]:
        """Of ``held``, the queues the member would still read if it looked at its share ``now``
        (without looking: for the simulation's check of one reader at a time)."""
        view = self.view
        if view is None or view.stale(now):
            return []
        if self._asked is not None and self._asked[0] is view:
            return list(held)
        target = self.target(view, False, held)
        return [q for q in held if q in target and q in view.granted]

    def target(self, view: View, stale: bool, held: Sequence[int]) -> list[int]:
        """The queues this member should hold by ``view``, given those it ``held`` (sorted): none once
        stale (the engine has taken it for dead: others read its queues); while the engine has not
        settled, what it holds; else its share by RocketMQ's average allocation."""
        if stale:
            return []
        if not view.settled and held:
            return list(held)
        return allocate_averagely(range(view.queue_count), view.members, self.client_id)

    def reading(self, queues: Sequence[int]) -> None:
        self.held = tuple(queues)

    def want(self, queues: Sequence[int]) -> bool:
        """Ask for exactly ``queues`` from now on; True if that changed (a heartbeat should go now)."""
        wanted = tuple(queues)
        changed = wanted != self.wanted
        for queue_id in set(self.wanted) - set(wanted):
            self._released[queue_id] = self.sent + 1  # the next heartbeat lets it go
        for queue_id in wanted:
            if self._released.get(queue_id, 0) > self.sent:  # let go and wanted again before any heartbeat said so
                del self._released[queue_id]
        self.wanted = wanted
        return changed
