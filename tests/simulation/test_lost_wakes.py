"""A wake-up lost on a PUB socket (a slow joiner, a full queue) delays the facts it announces by at
most a tick: the receivers read the shared slots on their ticks too."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from engine.ipc.protocol import encode_request
from harness.simulation.world import World, sim_config

pytestmark = pytest.mark.timeout(60)


def test_a_sync_send_is_answered_though_every_publication_is_lost(tmp_path: Path) -> None:
    world = World(tmp_path, random.Random(1), sim_config("SYNC_FLUSH"), publication_loss_ratio=1.0)
    replies: list[dict] = []
    world.network.to_client = lambda frames, sender: replies.append(msgspec.msgpack.decode(frames[-1]))
    with world.disk:
        world.start_all()
        world.pass_time(200)
        request = encode_request("send", 1, topic="orders", messages=[{"body": b"durable"}])
        assert world.network.from_client("front", b"client-1", request)
        world.pass_time(1_000)  # sync_flush_timeout_ms is 60 s here: only a tick can answer in time
    assert [reply["results"][0]["status"] for reply in replies if reply.get("id") == 1] == ["PUT_OK"]
