"""Long polling: pulls that found nothing new wait, parked, until a message arrives or time is up.

A parked pull costs a dict entry and a heap entry, no CPU: it is looked at
only when a dispatch touches its queue (``ready`` with that queue) or when
its deadline passes (``ready`` from the owner's tick). RocketMQ's
PullRequestHoldService does the same with a hold thread.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from engine.ipc.protocol import PopRequest, PullRequest
from engine.ipc.wire import Origin

QueueKey = tuple[str, int]


@dataclass(order=True)
class ParkedPull:
    """A parked pull, or a parked pop (which waits on every queue it may take from)."""

    deadline_ms: int
    seq: int
    reply_to: Origin = field(compare=False)
    request: PullRequest | PopRequest = field(compare=False)
    keys: tuple[QueueKey, ...] = field(compare=False, default=())
    queue_ids: list[int] = field(compare=False, default_factory=list)  # a pop's queues


class LongPolls:
    def __init__(self, *, parked_max: int, wait_ms_max: int) -> None:
        self.parked_max = parked_max
        self.wait_ms_max = wait_ms_max
        self.by_queue: dict[tuple[str, int], dict[int, ParkedPull]] = defaultdict(dict)
        self.deadlines: list[ParkedPull] = []
        self.seq = itertools.count()
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def park(self, reply_to: Origin, request: PullRequest | PopRequest, *, now_ms: int,
             deadline_ms: int | None = None, queue_ids: list[int] | None = None) -> bool:
        """Park a pull (or a pop over ``queue_ids``); False when too many are parked (it is then
        answered at once)."""
        if self.count >= self.parked_max:
            return False
        if deadline_ms is None:
            deadline_ms = now_ms + min(request.max_wait_ms, self.wait_ms_max)
        ids = queue_ids if queue_ids is not None else [request.queue_id or 0]
        keys = tuple((request.topic, queue_id) for queue_id in ids)
        parked = ParkedPull(deadline_ms, next(self.seq), reply_to, request, keys, ids)
        for key in keys:
            self.by_queue[key][parked.seq] = parked
        heapq.heappush(self.deadlines, parked)
        self.count += 1
        return True

    def _take(self, parked: ParkedPull) -> bool:
        taken = False
        for key in parked.keys:
            queue = self.by_queue.get(key)
            if queue is None or queue.pop(parked.seq, None) is None:
                continue
            taken = True
            if not queue:
                del self.by_queue[key]
        if taken:
            self.count -= 1
        return taken

    def ready(self, queues: set[tuple[str, int]], now_ms: int) -> list[ParkedPull]:
        """Unpark and return the pulls of ``queues`` and every pull whose deadline passed.

        The caller serves each; one that still finds nothing before its deadline
        parks again (``park`` with its ``deadline_ms``).
        """
        woken: list[ParkedPull] = []
        for key in sorted(queues):  # in one order every run: a set of strings is not (a replay must be)
            for parked in list(self.by_queue.get(key, {}).values()):
                if self._take(parked):
                    woken.append(parked)
        while self.deadlines and self.deadlines[0].deadline_ms <= now_ms:
            parked = heapq.heappop(self.deadlines)
            if self._take(parked):
                woken.append(parked)
        return woken
