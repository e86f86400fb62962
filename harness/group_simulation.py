"""A seeded simulation of a consumer group sharing a topic's queues: the front's real membership
(``engine/services/group_members.py``) and each member's real decisions (``rmqpy/_member_state.py``)
on a simulated clock, with members that come, go, die and stall, heartbeats lost or late, and
a front that restarts and forgets who reads what.

Everything else is a model: the queues (lists of messages a producer appends to), the committed
offsets (kept by the front; a restart keeps them, as the offsets file does), and each member's
reading: between two looks at its share it hands out the next messages of each queue it reads
and commits them, as ``PullConsumer`` does at each poll.

Invariants, checked as the run goes and at its end:

* one reader at a time: whenever a member hands out a message of a queue, no other live member
  would hand one out of it if it looked at its share then (``MemberState.keeps``);
* at least once: after a quiet time at the end (no faults, every member up), every message the
  producer appended has been handed out, and every queue has exactly one reader.

    run = simulate_group(seed)        # GroupRun: its trace, and the violations found (none)
    python scripts/simulate.py --consumer-group --seeds 3000
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.errors import RequestError
from engine.services.group_members import GroupMembers
from rmqpy._member_state import MemberState

SESSION_MS = 1_500
QUEUES = 6
LOOK_S = 0.05  # how often a member looks at its share and reads
BATCH = 16  # messages of a queue a member hands out (and commits) between two looks
LATENCY_S = (0.0005, 0.03)  # one way, front and member
RUN_S = 40.0
QUIET_S = 10.0  # at the end: no faults, every member up
PERSIST_S = 5.0  # the front writes the groups with members this often: it restarts only after the first write


@dataclass
class Member:
    state: MemberState
    alive: bool = True
    paused_until: float = 0.0
    book: dict[int, int] = field(default_factory=dict)  # queue -> next offset to hand out
    next_beat: float = 0.0

    def up(self, now: float) -> bool:
        return self.alive and now >= self.paused_until


@dataclass
class GroupRun:
    seed: int
    trace: list[str] = field(default_factory=list)  # members joining, dying, stalling; the front restarting
    violations: list[str] = field(default_factory=list)
    handed_out: int = 0
    front_restarts: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def figures(self) -> dict[str, int]:
        return {"handed_out": self.handed_out, "front_restarts": self.front_restarts}


class GroupSimulation:
    def __init__(self, seed: int, *, member_factory: Callable[[str], MemberState] = MemberState) -> None:
        self.rng = random.Random(seed)
        self.run = GroupRun(seed)
        self.now = 0.0
        self.front = GroupMembers(SESSION_MS, 1_000)
        self.committed = [0] * QUEUES
        self.queues: list[list[str]] = [[] for _ in range(QUEUES)]
        self.members: dict[str, Member] = {}
        self.seen: set[str] = set()
        self.factory = member_factory
        self.names = itertools.count()
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.faults = True
        self.lost = 0.1  # the chance that one heartbeat or its reply is lost

    # -- the event loop ----------------------------------------------------------------------

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    def latency(self) -> float:
        return self.rng.uniform(*LATENCY_S)

    def note(self, text: str) -> None:
        self.run.trace.append(f"{self.now:8.3f} {text}")

    def until(self, end: float) -> None:
        while self._events and self._events[0][0] <= end:
            when, _, action = heapq.heappop(self._events)
            self.now = when
            action()
        self.now = end

    # -- members -----------------------------------------------------------------------------

    def join(self) -> None:
        name = f"m{next(self.names)}"
        self.members[name] = Member(self.factory(name))
        self.note(f"{name} joins")
        self.beat(name)
        self.at(self.now + LOOK_S, lambda: self.look(name))

    def beat(self, name: str, *, leaving: bool = False) -> None:
        member = self.members[name]
        if not member.alive:
            return
        sent_at = self.now
        request = member.state.request(self.now, leaving=leaving)
        number = member.state.sent
        if self.faults and self.rng.random() < self.lost:
            self.note(f"{name}'s heartbeat lost")
        else:
            self.at(self.now + self.latency(), lambda: self.at_front(name, request, sent_at, number))
        if not leaving:
            interval = member.state.interval_s() if member.state.view is not None else 0.2
            member.next_beat = self.now + interval
            due = member.next_beat
            self.at(due, lambda: self.beat_if_due(name, due))

    def beat_if_due(self, name: str, due: float) -> None:
        member = self.members[name]
        if member.next_beat == due and member.up(self.now):
            self.beat(name)
        elif member.next_beat == due and member.alive:  # stalled: it beats once it runs again
            self.at(member.paused_until, lambda: self.beat_if_due(name, due))

    def at_front(self, name: str, request: dict[str, Any], sent_at: float, number: int) -> None:
        front = self.front
        try:
            membership = front.beat("g", "t", request["client_id"], int(self.now * 1000), queues=request["queues"],
                                    held=request["held"], seq=request["seq"], leaving=request["leaving"])
        except RequestError as exc:
            self.run.violations.append(f"{self.now:.3f}: the front refused {name}: {exc}")
            return
        reply = {"members": membership.members, "granted": membership.granted, "settled": membership.settled,
                 "queue_count": QUEUES, "session_timeout_ms": SESSION_MS}
        if self.faults and self.rng.random() < self.lost:
            return
        self.at(self.now + self.latency(), lambda: self.on_reply(name, reply, sent_at, number, front))

    def on_reply(self, name: str, reply: dict[str, Any], sent_at: float, number: int, front: GroupMembers) -> None:
        member = self.members[name]
        if member.alive and front is self.front:  # a reply of the front before its restart is lost with it
            member.state.on_reply(reply, sent_at, self.now, number)

    def look(self, name: str) -> None:
        """The consumer between two polls: its share, then one message of each queue it reads."""
        member = self.members[name]
        if not member.alive:
            return
        self.at(max(self.now, member.paused_until) + LOOK_S, lambda: self.look(name))
        if not member.up(self.now) or member.state.view is None:
            return
        share = member.state.share(sorted(member.book), self.now)
        if share is not None:
            hold, target = share
            for queue_id in [q for q in member.book if q not in hold]:
                self.commit(queue_id, member.book.pop(queue_id))
            member.state.reading(sorted(member.book))
            if member.state.want(target):
                self.beat(name)
            for queue_id in hold:
                member.book.setdefault(queue_id, self.committed[queue_id])
            member.state.reading(sorted(member.book))
        for queue_id, offset in sorted(member.book.items()):
            end = min(len(self.queues[queue_id]), offset + BATCH)
            for next_offset in range(offset, end):
                self.hand_out(name, queue_id, next_offset)
            if end > offset:
                member.book[queue_id] = end
                self.commit(queue_id, end)

    def commit(self, queue_id: int, offset: int) -> None:
        self.committed[queue_id] = offset  # the front applies commits in the order they come

    def hand_out(self, name: str, queue_id: int, offset: int) -> None:
        for other, member in self.members.items():
            if other != name and member.alive and queue_id in member.state.keeps(sorted(member.book), self.now):
                self.run.violations.append(f"{self.now:.3f}: {name} hands out {queue_id}/{offset} while {other} "
                                           f"also reads queue {queue_id}")
        self.seen.add(self.queues[queue_id][offset])
        self.run.handed_out += 1

    # -- faults ------------------------------------------------------------------------------

    def produce(self) -> None:
        queue_id = self.rng.randrange(QUEUES)
        self.queues[queue_id].append(f"{queue_id}-{len(self.queues[queue_id])}")
        if self.faults:  # the quiet time at the end lets the group read what is left
            self.at(self.now + self.rng.expovariate(50), self.produce)

    def fault(self) -> None:
        if not self.faults:
            return
        self.at(self.now + self.rng.expovariate(1 / 1.5), self.fault)
        alive = [n for n, m in self.members.items() if m.alive]
        kind = self.rng.choice(["join", "join", "kill", "close", "stall", "stall", "restart", "lossy"])
        if (kind == "join" and len(alive) < 8) or not alive:
            self.join()
        elif kind == "kill" and len(alive) > 1:
            name = self.rng.choice(alive)
            self.members[name].alive = False
            self.note(f"{name} killed")
        elif kind == "close" and len(alive) > 1:
            name = self.rng.choice(alive)
            member = self.members[name]
            for queue_id, offset in member.book.items():
                self.commit(queue_id, offset)
            member.book.clear()
            member.state.reading([])
            self.beat(name, leaving=True)
            member.alive = False
            self.note(f"{name} closes")
        elif kind == "stall":
            name = self.rng.choice(alive)
            member = self.members[name]
            member.paused_until = self.now + self.rng.uniform(0.1, 3 * SESSION_MS / 1000)
            self.note(f"{name} stalls until {member.paused_until:.3f}")
        elif kind == "restart" and self.now >= PERSIST_S:
            # The groups with members were on disk (config/sharingGroups.json, written every 5 s): the
            # restarted front waits a session for their members before it grants anything new.
            self.front = GroupMembers(SESSION_MS, 1_000, started_ms=int(self.now * 1000), inherited=[("g", "t")])
            self.run.front_restarts += 1
            self.note("the front restarts: membership forgotten")
        elif kind == "lossy":
            self.lost = self.rng.choice([0.0, 0.1, 0.3])

    # -- the run -----------------------------------------------------------------------------

    def simulate(self) -> GroupRun:
        for _ in range(self.rng.randint(1, 4)):
            self.join()
        self.at(0.0, self.produce)
        self.at(self.rng.uniform(0.5, 2.0), self.fault)
        self.until(RUN_S)
        self.faults = False
        self.lost = 0.0
        for member in self.members.values():
            member.paused_until = min(member.paused_until, self.now)
        if not any(m.alive for m in self.members.values()):
            self.join()
        self.until(RUN_S + QUIET_S)
        self.check_end()
        return self.run

    def check_end(self) -> None:
        produced = {m for queue in self.queues for m in queue}
        missing = produced - self.seen
        backlog = sum(len(q) for q in self.queues) - sum(self.committed)
        if len(missing) > 0 and backlog > 0:
            self.run.violations.append(f"after the quiet time {len(missing)} messages never handed out "
                                       f"(e.g. {sorted(missing)[:3]})")
        readers = [sorted(q for m in self.members.values() if m.alive for q in m.book if q == queue_id)
                   for queue_id in range(QUEUES)]
        for queue_id, found in enumerate(readers):
            if len(found) != 1:
                self.run.violations.append(f"after the quiet time queue {queue_id} has {len(found)} readers")


def simulate_group(seed: int, **options: Any) -> GroupRun:
    return GroupSimulation(seed, **options).simulate()
