"""Which owners a pop that names no queue goes to, and in which order.

A topic's queues are spread over the owners (``owner_of``). A pop without a queue id is
sent to the first owner of its order with the queues of the topic that owner holds; an
owner with nothing for it now hands it back (``PopElsewhere``) with the rest of the order,
and the front sends it on, so every owner's queues are looked at before one of them parks
it (long polling). The first owner is taken in turn, one pop after another, so no owner's
queues are always looked at first.

Called by the front (``engine/actors/front.py``) for each pop without a queue id.
"""

from __future__ import annotations

import functools

from engine.store.records import owner_of

# (owner, its queue ids of the topic), in the order the owners are asked
PopOrder = list[tuple[int, list[int]]]


@functools.lru_cache(maxsize=4096)
def queues_by_owner(topic: str, queue_count: int, owner_count: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(owner, its queue ids of the topic) for each owner holding some, in owner order."""
    by_owner: dict[int, list[int]] = {}
    for queue_id in range(queue_count):
        by_owner.setdefault(owner_of(topic, queue_id, owner_count), []).append(queue_id)
    return tuple((owner, tuple(queue_ids)) for owner, queue_ids in sorted(by_owner.items()))


class PopFanOut:
    """The turn of each topic: which owner its next pop asks first."""

    def __init__(self, owner_count: int) -> None:
        self.owner_count = owner_count
        self.turn: dict[str, int] = {}

    def order(self, topic: str, queue_count: int) -> PopOrder:
        """The owners the next pop of ``topic`` (of ``queue_count`` readable queues) asks, in order."""
        by_owner = queues_by_owner(topic, queue_count, self.owner_count)
        turn = self.turn.get(topic, 0) % len(by_owner)
        self.turn[topic] = turn + 1
        return [(owner, list(queue_ids)) for owner, queue_ids in by_owner[turn:] + by_owner[:turn]]
