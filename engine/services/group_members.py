"""The members of consumer groups, as their heartbeats tell: who shares a topic's queues.

A pull consumer that shares its group's queues (rmqpy's ``PullConsumer``) sends a
``heartbeat`` every third of ``consumer_session_timeout_ms``; the front keeps, per (group,
topic), each member's client id and when its session ends. Each reply names the live
members, sorted, and every member divides the queues among them the same way
(``rmqpy/_allocation.py``, RocketMQ's ``AllocateMessageQueueAveragely``): the engine keeps
the membership, the members keep the allocation (RocketMQ's ``ConsumerManager`` and its
clients' ``RebalanceImpl``).

A member leaves at once with ``leaving`` (a consumer's close), or when its session ends
without a heartbeat (a dead process): the others see the change in their next reply.

Membership lives in memory: after the front restarts (or another engine of a broker set
becomes master) it is rebuilt from the next heartbeats. Until a whole session has passed
since a group's first heartbeat here, replies say ``settled: false``: some members may not
have beaten yet, and members that already hold queues keep them rather than share them
out over a partial list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import ErrorCode, RequestError


@dataclass
class _Group:
    first_beat_ms: int  # the first heartbeat this front took for the (group, topic)
    sessions: dict[str, int] = field(default_factory=dict)  # client id -> monotonic ms its session ends


@dataclass(frozen=True)
class Membership:
    """What a heartbeat's reply says: the live members (sorted) and whether the list is complete."""

    members: list[str]
    settled: bool


class GroupMembers:
    def __init__(self, session_timeout_ms: int, members_max: int) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.members_max = members_max  # sessions kept, over all groups
        self._groups: dict[tuple[str, str], _Group] = {}
        self._count = 0

    def beat(self, group: str, topic: str, client_id: str, now_ms: int, *, leaving: bool = False) -> Membership:
        """A member's heartbeat (or its leaving): the group's membership after it. LIMIT_EXCEEDED
        for a new member while ``members_max`` sessions are live."""
        key = (group, topic)
        state = self._groups.get(key)
        if not leaving and (state is None or client_id not in state.sessions) and self._count >= self.members_max:
            self.expire(now_ms)
            if self._count >= self.members_max:
                raise RequestError(ErrorCode.LIMIT_EXCEEDED, f"{self.members_max} consumer group members are live "
                                                             f"(consumer_group_members_max)")
        if state is None:
            state = self._groups[key] = _Group(first_beat_ms=now_ms)
        self._count -= len(state.sessions)
        if leaving:
            state.sessions.pop(client_id, None)
        else:
            state.sessions[client_id] = now_ms + self.session_timeout_ms
        self._count += len(state.sessions)
        live = sorted(member for member, ends in state.sessions.items() if ends > now_ms)
        return Membership(live, settled=now_ms - state.first_beat_ms >= self.session_timeout_ms)

    def expire(self, now_ms: int) -> None:
        """Drop ended sessions, and the groups left with none."""
        for key in list(self._groups):
            state = self._groups[key]
            state.sessions = {m: ends for m, ends in state.sessions.items() if ends > now_ms}
            if not state.sessions and now_ms - state.first_beat_ms >= self.session_timeout_ms:
                del self._groups[key]
        self._count = sum(len(state.sessions) for state in self._groups.values())

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._groups if k[1] == topic]:
            self._count -= len(self._groups.pop(key).sessions)

    def member_counts(self) -> dict[tuple[str, str], int]:
        """Members per (group, topic) whose sessions had not ended at the last expiry, for the metrics."""
        return {key: len(state.sessions) for key, state in self._groups.items() if state.sessions}
