"""The members of consumer groups, as their heartbeats tell: who shares a topic's queues, and
who holds each queue now.

A pull consumer that shares its group's queues (rmqpy's ``PullConsumer``) sends a
``heartbeat`` every third of ``consumer_session_timeout_ms``; the front keeps, per (group,
topic), each member's client id and when its session ends. Each reply names the live
members, sorted, and every member divides the queues among them the same way
(``rmqpy/_allocation.py``, RocketMQ's ``AllocateMessageQueueAveragely``): the engine keeps
the membership, the members keep the allocation (RocketMQ's ``ConsumerManager`` and its
clients' ``RebalanceImpl``).

Hand-over. A heartbeat also names the queues its member wants to hold, and the reply
grants those no other live member holds: a queue changes hands only once its holder let
it go (committing its position first) or its session ended. So two members never read
one queue at once, even while their views of the group differ for a heartbeat or two.

    heartbeat(queues=[3, 4], held=[])   ->  granted [4]     (3 is still held by another member)
    ... the other lets 3 go (its heartbeat no longer names it) ...
    heartbeat(queues=[3, 4], held=[4])  ->  granted [3, 4]

A member leaves at once with ``leaving`` (a consumer's close), or when its session ends
without a heartbeat (a dead process): its queues are free, and the others see the change in
their next reply.

Membership lives in memory: after the front restarts (or another engine of a broker set
becomes master) it is rebuilt from the next heartbeats, each member claiming again what it
reads (``held``). The groups that had members are on disk (``engine/store/sharing_groups.py``,
shipped to replicas): for such an *inherited* group, until a whole session has passed since
its first heartbeat here, replies say ``settled: false`` and a member is granted only queues it
says it reads: the front cannot tell a queue nobody reads from one whose reader has not beaten
yet, so a new member waits (at most one session) rather than read a queue another still reads.
A group the front never had is settled at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.errors import ErrorCode, RequestError


@dataclass
class _Group:
    sessions: dict[str, int] = field(default_factory=dict)  # client id -> monotonic ms its session ends
    holders: dict[int, str] = field(default_factory=dict)  # queue id -> the member that holds it
    seqs: dict[str, int] = field(default_factory=dict)  # client id -> the number of its last heartbeat taken

    def live(self, member: str, now_ms: int) -> bool:
        return self.sessions.get(member, 0) > now_ms


@dataclass(frozen=True)
class Membership:
    """What a heartbeat's reply says: the live members (sorted), whether the list is complete,
    and the queues the member holds now."""

    members: list[str]
    settled: bool
    granted: list[int]


class GroupMembers:
    def __init__(self, session_timeout_ms: int, members_max: int, *, started_ms: int = 0,
                 inherited: Iterable[tuple[str, str]] = ()) -> None:
        """``inherited``: the (group, topic) pairs that had members before this front started (at
        ``started_ms``)."""
        self.session_timeout_ms = session_timeout_ms
        self.members_max = members_max  # sessions kept, over all groups
        self._groups: dict[tuple[str, str], _Group] = {}
        self._count = 0
        self.started_ms = started_ms
        self.inherited = set(inherited)  # not settled yet: members may read queues this front does not know of

    def _settled(self, key: tuple[str, str], now_ms: int) -> bool:
        """A group is settled when it is not inherited, or a whole session after this front started
        (every member still alive has beaten since)."""
        if self.inherited and now_ms - self.started_ms >= self.session_timeout_ms:
            self.inherited.clear()
        return key not in self.inherited

    def beat(self, group: str, topic: str, client_id: str, now_ms: int, *, queues: Iterable[int] = (),
             held: Iterable[int] = (), seq: int = 0, leaving: bool = False) -> Membership:
        """A member's heartbeat (or its leaving), wanting to hold ``queues`` and reading ``held``: the
        group's membership after it. A heartbeat numbered (``seq``) below the member's last one taken
        came late (over an earlier connection): it changes nothing. LIMIT_EXCEEDED for a new member
        while ``members_max`` sessions are live."""
        key = (group, topic)
        state = self._groups.get(key)
        if not leaving and (state is None or client_id not in state.sessions) and self._count >= self.members_max:
            self.expire(now_ms)
            if self._count >= self.members_max:
                raise RequestError(ErrorCode.LIMIT_EXCEEDED, f"{self.members_max} consumer group members are live "
                                                             f"(consumer_group_members_max)")
        if state is None:
            state = self._groups[key] = _Group()
        settled = self._settled(key, now_ms)
        if seq and seq < state.seqs.get(client_id, 0):
            return self._membership(state, client_id, now_ms, settled)
        if seq:
            state.seqs[client_id] = seq
        self._count -= len(state.sessions)
        wanted = set() if leaving else set(queues) if settled else set(queues) & set(held)
        if leaving:
            state.sessions.pop(client_id, None)
            state.seqs.pop(client_id, None)
        else:
            state.sessions[client_id] = now_ms + self.session_timeout_ms
        self._count += len(state.sessions)
        for queue_id, holder in list(state.holders.items()):
            if (holder == client_id and queue_id not in wanted) or not state.live(holder, now_ms):
                del state.holders[queue_id]  # let go, or its holder's session ended
        for queue_id in wanted:
            state.holders.setdefault(queue_id, client_id)
        return self._membership(state, client_id, now_ms, settled)

    @staticmethod
    def _membership(state: _Group, client_id: str, now_ms: int, settled: bool) -> Membership:
        live = sorted(member for member in state.sessions if state.live(member, now_ms))
        granted = sorted(queue_id for queue_id, holder in state.holders.items() if holder == client_id)
        return Membership(live, settled, granted)

    def expire(self, now_ms: int) -> list[tuple[str, str]]:
        """Drop ended sessions and their queues, and the groups left with none: returned."""
        gone = []
        for key in list(self._groups):
            state = self._groups[key]
            state.sessions = {m: ends for m, ends in state.sessions.items() if ends > now_ms}
            state.holders = {q: m for q, m in state.holders.items() if m in state.sessions}
            state.seqs = {m: n for m, n in state.seqs.items() if m in state.sessions}
            if not state.sessions:
                del self._groups[key]
                gone.append(key)
        self._count = sum(len(state.sessions) for state in self._groups.values())
        return gone

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._groups if k[1] == topic]:
            self._count -= len(self._groups.pop(key).sessions)

    def member_counts(self) -> dict[tuple[str, str], int]:
        """Members per (group, topic) whose sessions had not ended at the last expiry, for the metrics."""
        return {key: len(state.sessions) for key, state in self._groups.items() if state.sessions}
