"""A seeded simulation of a consumer group sharing a topic's queues over one or more broker sets:
each set's front's real membership (``engine/services/front/group_members.py``) and each member's real
decisions (``rmqpy/_member_state.py``) on a simulated clock, with members that come, go, die and
stall, heartbeats lost or late, fronts that restart and forget who reads what, and (with two
sets) a set that fails over: no master for a while, then a new one.

A member is one process with a reader per broker set, as ``PullConsumer(cluster=...)`` is a
``PullConsumer`` per set: each reader heartbeats to its set's front and takes its share of that
set's queues. A reader of a set that failed over is replaced by a new one (a new client id)
once the member sees the new master, as ``ClusterPullConsumer`` does at its next route read.

Everything else is a model: the queues (lists of messages a producer appends to, passing over
a set without a master as ``Producer(cluster=...)`` does), the committed offsets (kept by each
set; a restart or failover keeps them, as the offsets file and its replication do), and each
reader's reading: between two looks at its share it hands out the next messages of each queue
it reads and commits them, as ``PullConsumer`` does at each poll.

Invariants, checked as the run goes and at its end:

* one reader at a time: whenever a member hands out a message of a queue, no other live member
  would hand one out of it if it looked at its share then (``MemberState.keeps``);
* at least once: after a quiet time at the end (no faults, every member up), every message the
  producer appended (every acknowledged one) has been handed out, and every queue of every set
  has exactly one reader.

    run = simulate_group(seed)                # GroupRun: its trace, and the violations found (none)
    run = simulate_group(seed, sets=2)        # a topic over two broker sets
    python scripts/simulate.py --consumer-group --seeds 3000 [--broker-sets 2]
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.errors import RequestError
from engine.services.front.group_members import GroupMembers
from rmqpy._member_state import MemberState

SESSION_MS = 1_500
SET_QUEUES = (6, 4)  # the topic's queues on each broker set (the first alone with one set)
LOOK_S = 0.05  # how often a member looks at its share and reads
BATCH = 16  # messages of a queue a member hands out (and commits) between two looks
LATENCY_S = (0.0005, 0.03)  # one way, front and member
RUN_S = 40.0
QUIET_S = 10.0  # at the end: no faults, every member up
FAILOVER_S = (0.3, 3.0)  # how long a set has no master when it fails over


@dataclass
class Reader:
    """A member's reader of one broker set (a ``PullConsumer`` of ``ClusterPullConsumer``)."""

    state: MemberState
    epoch: int  # the set's master it reads from
    book: dict[int, int] = field(default_factory=dict)  # queue -> next offset to hand out
    next_beat: float = 0.0


@dataclass
class BrokerSetModel:
    queues: list[list[str]]
    committed: list[int]
    front: GroupMembers
    epoch: int = 0  # a new master: a new epoch
    down_until: float = 0.0  # failing over: no master until then

    def up(self, now: float) -> bool:
        return now >= self.down_until


@dataclass
class Member:
    readers: list[Reader]  # one per broker set
    alive: bool = True
    paused_until: float = 0.0

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
    def __init__(self, seed: int, *, sets: int = 1,
                 member_factory: Callable[[str], MemberState] = MemberState) -> None:
        self.rng = random.Random(seed)
        self.run = GroupRun(seed)
        self.now = 0.0
        self.sets = [BrokerSetModel([[] for _ in range(n)], [0] * n, GroupMembers(SESSION_MS, 1_000))
                     for n in SET_QUEUES[:sets]]
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

    def reader(self, name: str, s: int) -> Reader:
        epoch = self.sets[s].epoch
        client_id = name if len(self.sets) == 1 else f"{name}@{s}.{epoch}"
        return Reader(self.factory(client_id), epoch)

    def join(self) -> None:
        name = f"m{next(self.names)}"
        self.members[name] = Member([self.reader(name, s) for s in range(len(self.sets))])
        self.note(f"{name} joins")
        for s in range(len(self.sets)):
            self.beat(name, s)
        self.at(self.now + LOOK_S, lambda: self.look(name))

    def beat(self, name: str, s: int, *, leaving: bool = False) -> None:
        member = self.members[name]
        if not member.alive:
            return
        reader = member.readers[s]
        sent_at = self.now
        request = reader.state.request(self.now, leaving=leaving)
        number = reader.state.sent
        if self.faults and self.rng.random() < self.lost:
            self.note(f"{name}'s heartbeat to set {s} lost")
        else:
            self.at(self.now + self.latency(), lambda: self.at_front(name, s, reader, request, sent_at, number))
        if not leaving:
            interval = reader.state.interval_s() if reader.state.view is not None else 0.2
            reader.next_beat = self.now + interval
            due = reader.next_beat
            self.at(due, lambda: self.beat_if_due(name, s, reader, due))

    def beat_if_due(self, name: str, s: int, reader: Reader, due: float) -> None:
        member = self.members[name]
        if member.readers[s] is not reader or reader.next_beat != due:
            return  # replaced after a failover, or beaten since
        if member.up(self.now):
            self.beat(name, s)
        elif member.alive:  # stalled: it beats once it runs again
            self.at(member.paused_until, lambda: self.beat_if_due(name, s, reader, due))

    def at_front(self, name: str, s: int, reader: Reader, request: dict[str, Any], sent_at: float,
                 number: int) -> None:
        broker_set = self.sets[s]
        if not broker_set.up(self.now) or reader.epoch != broker_set.epoch:
            return  # no master, or the heartbeat went to the master that failed: no answer
        front = broker_set.front
        try:
            membership = front.beat("g", "t", request["client_id"], int(self.now * 1000), queues=request["queues"],
                                    held=request["held"], seq=request["seq"], leaving=request["leaving"])
        except RequestError as exc:
            self.run.violations.append(f"{self.now:.3f}: set {s}'s front refused {name}: {exc}")
            return
        reply = {"members": membership.members, "granted": membership.granted, "settled": membership.settled,
                 "queue_count": len(broker_set.queues), "session_timeout_ms": SESSION_MS}
        if self.faults and self.rng.random() < self.lost:
            return
        self.at(self.now + self.latency(), lambda: self.on_reply(name, s, reader, reply, sent_at, number, front))

    def on_reply(self, name: str, s: int, reader: Reader, reply: dict[str, Any], sent_at: float, number: int,
                 front: GroupMembers) -> None:
        # a reply of the front before its restart is lost with it
        if self.members[name].alive and front is self.sets[s].front and self.members[name].readers[s] is reader:
            reader.state.on_reply(reply, sent_at, self.now, number)

    def look(self, name: str) -> None:
        """The consumer between two polls: for each set, its share, then the next messages of each queue
        it reads there."""
        member = self.members[name]
        if not member.alive:
            return
        self.at(max(self.now, member.paused_until) + LOOK_S, lambda: self.look(name))
        if not member.up(self.now):
            return
        for s, broker_set in enumerate(self.sets):
            if member.readers[s].epoch != broker_set.epoch and broker_set.up(self.now):
                member.readers[s] = self.reader(name, s)  # the set's new master: a new reader, no commit
                self.note(f"{name} reads set {s} at its new master")
                self.beat(name, s)
            if broker_set.up(self.now):
                self.look_at(name, s)

    def look_at(self, name: str, s: int) -> None:
        reader, broker_set = self.members[name].readers[s], self.sets[s]
        if reader.state.view is None:
            return
        share = reader.state.share(sorted(reader.book), self.now)
        if share is not None:
            hold, target = share
            for queue_id in [q for q in reader.book if q not in hold]:
                self.commit(s, queue_id, reader.book.pop(queue_id))
            reader.state.reading(sorted(reader.book))
            if reader.state.want(target):
                self.beat(name, s)
            for queue_id in hold:
                reader.book.setdefault(queue_id, broker_set.committed[queue_id])
            reader.state.reading(sorted(reader.book))
        for queue_id, offset in sorted(reader.book.items()):
            end = min(len(broker_set.queues[queue_id]), offset + BATCH)
            for next_offset in range(offset, end):
                self.hand_out(name, s, queue_id, next_offset)
            if end > offset:
                reader.book[queue_id] = end
                self.commit(s, queue_id, end)

    def commit(self, s: int, queue_id: int, offset: int) -> None:
        self.sets[s].committed[queue_id] = offset  # the front applies commits in the order they come

    def hand_out(self, name: str, s: int, queue_id: int, offset: int) -> None:
        for other, member in self.members.items():
            reader = member.readers[s]
            if other != name and member.alive and reader.epoch == self.sets[s].epoch \
                    and queue_id in reader.state.keeps(sorted(reader.book), self.now):
                self.run.violations.append(f"{self.now:.3f}: {name} hands out {s}:{queue_id}/{offset} while {other} "
                                           f"also reads queue {queue_id} of set {s}")
        self.seen.add(self.sets[s].queues[queue_id][offset])
        self.run.handed_out += 1

    # -- faults ------------------------------------------------------------------------------

    def produce(self) -> None:
        """One message to a queue of the whole route; a set without a master is passed over."""
        route = [(s, q) for s, broker_set in enumerate(self.sets) if broker_set.up(self.now)
                 for q in range(len(broker_set.queues))]
        if route:
            s, queue_id = self.rng.choice(route)
            queue = self.sets[s].queues[queue_id]
            queue.append(f"{s}:{queue_id}-{len(queue)}")
        if self.faults:  # the quiet time at the end lets the group read what is left
            self.at(self.now + self.rng.expovariate(50), self.produce)

    def fault(self) -> None:
        if not self.faults:
            return
        self.at(self.now + self.rng.expovariate(1 / 1.5), self.fault)
        alive = [n for n, m in self.members.items() if m.alive]
        kinds = ["join", "join", "kill", "close", "stall", "stall", "restart", "lossy"]
        kind = self.rng.choice(kinds + (["failover"] if len(self.sets) > 1 else []))
        if (kind == "join" and len(alive) < 8) or not alive:
            self.join()
        elif kind == "kill" and len(alive) > 1:
            name = self.rng.choice(alive)
            self.members[name].alive = False
            self.note(f"{name} killed")
        elif kind == "close" and len(alive) > 1:
            name = self.rng.choice(alive)
            member = self.members[name]
            for s, reader in enumerate(member.readers):
                for queue_id, offset in reader.book.items():
                    if reader.epoch == self.sets[s].epoch:  # a reader of a failed master cannot commit
                        self.commit(s, queue_id, offset)
                reader.book.clear()
                reader.state.reading([])
                self.beat(name, s, leaving=True)
            member.alive = False
            self.note(f"{name} closes")
        elif kind == "stall":
            name = self.rng.choice(alive)
            member = self.members[name]
            member.paused_until = self.now + self.rng.uniform(0.1, 3 * SESSION_MS / 1000)
            self.note(f"{name} stalls until {member.paused_until:.3f}")
        elif kind == "restart":
            # A group is on disk (config/sharingGroups.json) before its first grant: the restarted
            # front waits a session for its members before it grants anything new.
            s = self.rng.randrange(len(self.sets))
            self.sets[s].front = self.new_front()
            self.run.front_restarts += 1
            self.note(f"set {s}'s front restarts: membership forgotten")
        elif kind == "failover":
            s = self.rng.randrange(len(self.sets))
            broker_set = self.sets[s]
            if broker_set.up(self.now):
                broker_set.down_until = self.now + self.rng.uniform(*FAILOVER_S)
                broker_set.epoch += 1
                self.at(broker_set.down_until, lambda: self.new_master(s))
                self.note(f"set {s}'s master fails: a new one at {broker_set.down_until:.3f}")
        elif kind == "lossy":
            self.lost = self.rng.choice([0.0, 0.1, 0.3])

    def new_front(self) -> GroupMembers:
        return GroupMembers(SESSION_MS, 1_000, started_ms=int(self.now * 1000), inherited=[("g", "t")])

    def new_master(self, s: int) -> None:
        """The set's replica takes over: its front knows the groups (shipped ``sharingGroups.json``)."""
        self.sets[s].front = self.new_front()
        self.run.front_restarts += 1

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
        produced = {m for broker_set in self.sets for queue in broker_set.queues for m in queue}
        missing = produced - self.seen
        if missing:
            self.run.violations.append(f"after the quiet time {len(missing)} messages never handed out "
                                       f"(e.g. {sorted(missing)[:3]})")
        for s, broker_set in enumerate(self.sets):
            for queue_id in range(len(broker_set.queues)):
                found = [n for n, m in self.members.items()
                         if m.alive and m.readers[s].epoch == broker_set.epoch and queue_id in m.readers[s].book]
                if len(found) != 1:
                    self.run.violations.append(f"after the quiet time queue {queue_id} of set {s} has "
                                               f"{len(found)} readers")


def simulate_group(seed: int, **options: Any) -> GroupRun:
    return GroupSimulation(seed, **options).simulate()
