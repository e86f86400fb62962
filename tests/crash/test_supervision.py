"""Supervision policy: flapping actors are left down with a clear status; hung actors are replaced."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from engine.actors.base import PEER_WAIT_MS_MAX
from engine.client import EngineError
from engine.config import StoreConfig
from engine.ipc.control import EventStream, control
from engine.ipc.messages import StatusQuery
from engine.logs import LOG_DIR
from engine.store.records import owner_of
from harness.faults import kill_actor
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(120)


def test_a_flapping_actor_is_left_down_and_requests_get_service_not_available(store_dir: Path) -> None:
    config = StoreConfig.test_min().replace(restart_count_max=2, restart_window_ms=60_000, restart_backoff_ms=10)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        with engine.client(timeout_ms=5_000) as client:
            client.create_topic("flap", queue_count=1)
            client.send("flap", [{"body": b"x", "keys": ["k"]}], queue_id=0)
            owner = f"owner-{owner_of('flap', 0, config.consume_queue_owner_count)}"
            events = EventStream(store_dir)
            for _ in range(2):
                kill_actor(store_dir, owner)
                events.wait_for("recovery.done", name=owner)
            kill_actor(store_dir, owner)
            events.wait_for("actor.gave_up", name=owner)
            status = control(store_dir, StatusQuery())
            assert status.state == "DEGRADED"
            assert {a.name: a.lifecycle for a in status.actors}[owner] == "GAVE_UP"
            with pytest.raises(EngineError) as info:
                client.pull("flap", 0, 0)
            assert info.value.name == "SERVICE_NOT_AVAILABLE"
            assert client.send("flap", [{"body": b"still writable"}])[0]["status"] == "PUT_OK"
            for _ in range(2):
                kill_actor(store_dir, "writer")
                events.wait_for("recovery.done", name="writer")
            kill_actor(store_dir, "writer")
            events.wait_for("actor.gave_up", name="writer")
            with pytest.raises(EngineError) as info:
                client.send("flap", [{"body": b"x"}])
            assert info.value.name == "SERVICE_NOT_AVAILABLE"
            events.close()
    finally:
        engine.stop()
    assert b"not cleanly" in engine.output, "a degraded engine cannot stop cleanly"
    assert (store_dir / "abort").exists(), "so the abort marker stays and the next start recovers"


def test_a_hung_actor_is_killed_and_replaced(store_dir: Path) -> None:
    config = StoreConfig.test_min().replace(heartbeat_timeout_ms=1_500)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        events = EventStream(store_dir)
        pid = engine.actor_pids()["reput"]
        psutil.Process(pid).suspend()
        exited = events.wait_for("actor.exited", name="reput", timeout_ms=15_000)
        assert exited.pid == pid and exited.exit_code == -9
        events.wait_for("recovery.done", name="reput")
        events.close()
        with engine.client() as client:
            client.send("hung", [{"body": b"after"}], queue_id=0)
            assert client.pull("hung", 0, 0)["status"] in ("FOUND", "NO_MESSAGE_IN_QUEUE")
    finally:
        assert engine.stop() == 0


def test_a_restarted_front_runs_only_once_connected_to_the_actors_it_forwards_to(store_dir: Path) -> None:
    """A front that reported RUNNING before its connections were made would refuse the first requests
    (SERVICE_NOT_AVAILABLE) though every actor is up. With the writer paused (no handshake), a restarted
    front waits for it ``PEER_WAIT_MS_MAX``, then runs anyway and says what it lacks."""
    engine = EngineProcess(store_dir, config=StoreConfig.test_min())
    engine.start()
    try:
        events = EventStream(store_dir)
        writer = psutil.Process(engine.actor_pids()["writer"])
        writer.suspend()
        try:
            kill_actor(store_dir, "front")
            exited = events.wait_for("actor.exited", name="front")
            running = events.wait_for("recovery.done", name="front")
        finally:
            writer.resume()
        events.close()
        assert running.time_ms - exited.time_ms >= PEER_WAIT_MS_MAX
        log = (store_dir / LOG_DIR / "front.log").read_text()
        assert f"not connected to writer after {PEER_WAIT_MS_MAX} ms; serving anyway" in log
        with engine.client() as client:
            client.send("waited", [{"body": b"after"}], queue_id=0)
    finally:
        assert engine.stop() == 0
