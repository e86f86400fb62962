"""Kill any actor with SIGKILL under load: nothing acknowledged is lost, duplicated or corrupted.

Each test runs a producer thread against a live engine, kills an actor once
enough messages were acknowledged, waits on the supervisor's events for the
restart and its recovery, lets the producer go on, then reads every queue
back, checks every acknowledged message, stops the engine and runs
``check_store`` over the files.
"""

from __future__ import annotations

import random
from pathlib import Path

import psutil
import pytest

from engine.config import StoreConfig
from engine.ipc.control import EventStream
from engine.offline.check import check_store
from harness.faults import kill_actor
from harness.workload import Producer, ProducerThread, read_everything, verify
from supervisor.launcher import EngineProcess
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(180)

TOPICS = {"alpha": 4, "beta": 4}


def crash_config(flush_mode: str) -> StoreConfig:
    return StoreConfig.test_min().replace(flush_mode=flush_mode, segment_size_bytes=1 << 20,
                                          message_body_bytes_max=64 * 1024, send_batch_bytes_max=256 * 1024)


def start_producer(engine: EngineProcess, seed: int) -> ProducerThread:
    client = engine.client(timeout_ms=3_000)
    producer = Producer("p", client, TOPICS, random.Random(seed), body_sizes=(40, 300, 2000), batch_size=8)
    return ProducerThread(producer).start()


def finish_and_verify(engine: EngineProcess, producers: list[ProducerThread], config: StoreConfig) -> None:
    for thread in producers:
        thread.stop()
        thread.producer.client.close()
    with engine.client(timeout_ms=10_000) as client:
        wait_dispatched(client, timeout_ms=30_000)
        verdict = verify([t.producer for t in producers], read_everything(client, TOPICS))
    assert verdict.ok(), verdict.summary()
    assert verdict.acked > 0
    assert engine.stop() == 0
    findings = check_store(engine.store_dir, config)
    assert findings == [], "\n".join(map(str, findings))


@pytest.mark.parametrize(("role", "flush_mode"), [
    *((role, "ASYNC_FLUSH") for role in ("writer", "flusher", "owner", "index", "reput", "front")),
    pytest.param("writer", "SYNC_FLUSH", marks=pytest.mark.slow), ("flusher", "SYNC_FLUSH"),
    *(pytest.param(role, "SYNC_FLUSH", marks=pytest.mark.slow) for role in ("owner", "index", "reput", "front"))])
def test_killing_an_actor_under_load_loses_nothing_acknowledged(store_dir: Path, flush_mode: str, role: str) -> None:
    config = crash_config(flush_mode)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        events = EventStream(store_dir)
        producer = start_producer(engine, seed=hash((flush_mode, role)) & 0xFFFF)
        producer.wait_acked(200)
        name, pid = kill_actor(store_dir, role, rng=random.Random(7))
        exited = events.wait_for("actor.exited", name=name)
        assert exited.exit_code == -9 and exited.pid == pid
        events.wait_for("recovery.done", name=name)
        producer.wait_acked(producer.acked + 200)
        events.close()
        finish_and_verify(engine, [producer], config)
    finally:
        engine.stop()


@pytest.mark.parametrize("flush_mode", ["ASYNC_FLUSH", pytest.param("SYNC_FLUSH", marks=pytest.mark.slow)])
def test_killing_the_supervisor_stops_every_actor_and_a_restart_recovers(store_dir: Path, flush_mode: str) -> None:
    config = crash_config(flush_mode)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        producer = start_producer(engine, seed=11)
        producer.wait_acked(300)
        actors = [psutil.Process(pid) for pid in engine.actor_pids().values()]
        psutil.Process(engine.pid).kill()
        _gone, orphans = psutil.wait_procs(actors, timeout=15)
        assert orphans == [], f"actors outlived the supervisor: {orphans}"
        assert (store_dir / "abort").exists(), "a killed engine leaves the abort marker"
        engine.process.wait(10)  # type: ignore[union-attr]
        engine.process = None
        acked_before = producer.acked
        engine.start()
        producer.wait_acked(acked_before + 200)
        finish_and_verify(engine, [producer], config)
    finally:
        engine.stop()


@pytest.mark.parametrize("role", ["owner", "index", "reput"])
def test_actors_that_catch_up_in_small_slices_lose_nothing(store_dir: Path, role: str) -> None:
    """A restarted owner or index builder reads what it missed from the log a slice per loop turn
    (catch_up_bytes_per_turn_max), and the reput dispatcher publishes a few batches per turn
    (dispatch_batches_per_turn_max): tiny here, so that every catch-up takes many turns."""
    config = crash_config("ASYNC_FLUSH").replace(catch_up_bytes_per_turn_max=4096, dispatch_batches_per_turn_max=1,
                                                 dispatch_batch_records_max=16)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        events = EventStream(store_dir)
        producer = start_producer(engine, seed=11)
        for round_no in range(3):
            producer.wait_acked(producer.acked + 300)
            name, _pid = kill_actor(store_dir, role, rng=random.Random(round_no))
            events.wait_for("recovery.done", name=name)
        producer.wait_acked(producer.acked + 300)
        events.close()
        finish_and_verify(engine, [producer], config)
    finally:
        engine.stop()
