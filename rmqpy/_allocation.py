"""How the members of a consumer group divide a topic's queues: RocketMQ's
``AllocateMessageQueueAveragely``, the default of its clients.

Every member computes the same allocation from the same two sorted lists (the queues,
and the live members the engine names in its heartbeat replies), so no member needs to
ask another what it took. The queues go out in contiguous runs: with 8 queues and 3
members, the first two members take 3 queues and the last takes 2:

    queues   0 1 2 | 3 4 5 | 6 7
    member     a       b      c

With more members than queues, the last members take none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Q = TypeVar("Q")


def allocate_averagely(queues: Sequence[Q], members: Sequence[str], member: str) -> list[Q]:
    """The queues of ``member``: ``queues`` and ``members`` sorted the same way by every member.
    A member not in ``members`` (not yet seen by the engine) takes none."""
    if member not in members or not queues:
        return []
    index = members.index(member)
    count, total = len(members), len(queues)
    remainder = total % count
    size = 1 if total <= count else total // count + (1 if index < remainder else 0)
    start = index * size if index < remainder else index * size + remainder
    return [queues[(start + i) % total] for i in range(max(0, min(size, total - start)))]
