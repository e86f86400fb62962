"""A store whose ``consumequeue/`` directory was lost while the engine was stopped.

The ConsumeQueues are derived from the log: on start they are built again from it (RocketMQ's
recovery dispatches again from the greatest end of its queues, the first file when there is
none), every queue with its old offsets and contents, and new sends go on after them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.client import StoreClient
from engine.store.consume_queue import CONSUME_QUEUE_DIR
from supervisor.launcher import EngineProcess
from tests.helpers import wait_dispatched

TOPICS = {"orders": 4, "audit": 3}
MESSAGES = 1_000


def contents(client: StoreClient) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """Every queue's (queue offset, body) pairs, pulled from offset 0."""
    wait_dispatched(client)
    found = {}
    for topic, queues in TOPICS.items():
        for queue_id in range(queues):
            messages: list[tuple[int, bytes]] = []
            while True:
                reply = client.pull(topic, queue_id, len(messages), max_messages=256)
                batch = [(m["queue_offset"], bytes(m["body"])) for m in reply["messages"]]
                if not batch:
                    break
                messages += batch
            assert client.queue_stats(topic, queue_id)["max_offset"] == len(messages)
            found[(topic, queue_id)] = messages
    return found


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_lost_consume_queues_are_built_again_from_the_log_on_start(store_dir: Path) -> None:
    engine = EngineProcess(store_dir)
    with engine, engine.client() as client:
        for topic, queues in TOPICS.items():
            client.create_topic(topic, queue_count=queues)
        names = list(TOPICS)
        for i in range(0, MESSAGES, 10):
            topic = names[(i // 10) % len(names)]
            client.send(topic, [{"body": f"m{i + k}".encode()} for k in range(10)],
                        queue_id=(i // 20) % TOPICS[topic])
        before = contents(client)
    assert sum(map(len, before.values())) == MESSAGES
    shutil.rmtree(store_dir / CONSUME_QUEUE_DIR)
    with engine, engine.client() as client:
        assert contents(client) == before
        [result] = client.send("orders", [{"body": b"after"}], queue_id=0)
        assert result["queue_offset"] == len(before[("orders", 0)])  # no offset given twice
        after = contents(client)
        assert after[("orders", 0)] == [*before[("orders", 0)], (len(before[("orders", 0)]), b"after")]
