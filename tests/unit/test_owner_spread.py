"""A topic's queues are spread evenly over the ConsumeQueue owners, whatever its name."""

from __future__ import annotations

import random
import string
from collections import Counter

import pytest

from engine.store.records import owner_of


@pytest.mark.parametrize("owners", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("queues", [1, 4, 8, 16])
def test_every_topic_spreads_its_queues_evenly(owners: int, queues: int) -> None:
    rng = random.Random(owners * 100 + queues)
    for _ in range(1000):
        topic = "".join(rng.choices(string.ascii_letters + string.digits + "-_%", k=rng.randint(1, 40)))
        per_owner = Counter(owner_of(topic, q, owners) for q in range(queues))
        assert max(per_owner.values()) - min(per_owner.values(), default=0) <= 1, (topic, per_owner)
        assert len(per_owner) == min(owners, queues), (topic, per_owner)


def test_the_mapping_is_stable_and_documented() -> None:
    # (crc32("orders") + queue_id) % owners: the same on every run and every machine
    assert [owner_of("orders", q, 2) for q in range(4)] == [(0xE52FFDEE + q) % 2 for q in range(4)]
    assert [owner_of("TopicTest", q, 4) for q in range(4)] == [(0x84743BC9 + q) % 4 for q in range(4)]
