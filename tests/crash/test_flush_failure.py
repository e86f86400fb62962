"""A failed fsync is never retried: no acknowledgement past it, the actor that flushes the log
restarts (and the writer with it), nothing lost.

strace attaches to the running actor, every thread of it, and makes its fdatasync calls fail
with EIO or stall (the fault-injection tool of shared/reference/reliability.md). Under
SYNC_FLUSH the writer syncs its own appends; under ASYNC_FLUSH the flusher flushes the log.
"""

from __future__ import annotations

import random
import selectors
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from engine.client import StoreClient
from engine.config import StoreConfig
from engine.ipc.control import ControlTimeout, EventStream
from engine.offline.check import check_store
from harness.faults import actor_pids
from harness.workload import Producer, read_everything, verify, wait_dispatched
from supervisor.launcher import EngineProcess
from tests.helpers import require

pytestmark = pytest.mark.timeout(180)

TOPICS = {"fsync": 2}


def inject_into_fdatasync(pid: int, fault: str) -> subprocess.Popen[bytes]:
    """Attach strace to ``pid`` (each of its threads) so that its fdatasync calls get ``fault``;
    return once attached."""
    tracer = subprocess.Popen(["strace", "-f", "-p", str(pid), "-o", "/dev/null", "-e", "trace=fdatasync",
                               "-e", f"inject=fdatasync:{fault}"], stderr=subprocess.PIPE)
    assert tracer.stderr is not None
    seen = b""
    deadline = time.monotonic() + 20
    with selectors.DefaultSelector() as selector:
        selector.register(tracer.stderr, selectors.EVENT_READ)
        while b"attached" not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and selector.select(remaining), f"strace did not attach: {seen!r}"
            chunk = tracer.stderr.read1(4096)  # type: ignore[attr-defined]
            assert chunk, f"strace exited: {seen!r}"
            seen += chunk
    return tracer


def sends_go_on_and_nothing_is_lost(producer: Producer, client: StoreClient) -> None:
    """After the restart: sends are taken again (within 30 s), and every acknowledged one is stored once."""
    deadline = time.monotonic() + 30
    while producer.send_batch() == 0:
        assert time.monotonic() < deadline, dict(producer.errors)
    wait_dispatched(client)
    verdict = verify([producer], read_everything(client, TOPICS))
    assert verdict.ok(), verdict.summary()


def test_a_failed_flush_stops_acknowledgements_and_recovery_runs(store_dir: Path) -> None:
    require(shutil.which("strace") is not None, "strace")
    config = StoreConfig.test_min().replace(flush_mode="SYNC_FLUSH")
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    tracer = None
    try:
        client = engine.client(timeout_ms=10_000)
        producer = Producer("p", client, TOPICS, random.Random(2), batch_size=4)
        for _ in range(20):
            assert producer.send_batch() == 4
        events = EventStream(store_dir)
        tracer = inject_into_fdatasync(actor_pids(store_dir)["writer"], "error=EIO")
        assert producer.send_batch() == 0, "a batch whose flush failed was acknowledged"
        assert producer.errors.get("FLUSH_FAILED", 0) + producer.errors.get("TIMEOUT", 0) >= 1
        assert events.wait_for("actor.exited", name="writer").exit_code == 70
        events.wait_for("recovery.done", name="writer")
        events.close()
        sends_go_on_and_nothing_is_lost(producer, client)
        client.close()
    finally:
        if tracer is not None:
            tracer.kill()
            tracer.wait()
        assert engine.stop() == 0
    assert check_store(store_dir, config) == []


@pytest.mark.parametrize("in_loop", [False, True], ids=["thread", "in-loop"])
def test_a_slow_disk_gives_flush_disk_timeout_not_a_hang(store_dir: Path, in_loop: bool) -> None:
    """The writer's syncs in its flush thread: a stalled disk stalls the thread, and the loop answers
    FLUSH_DISK_TIMEOUT. Made in the loop (``writer_sync_in_loop_ms_max``, the default), the sync the
    stall begins in holds the loop for that sync, answered once done; from then on the thread syncs,
    and the loop answers as before, until a sync is quick again."""
    require(shutil.which("strace") is not None, "strace")
    config = StoreConfig.test_min().replace(flush_mode="SYNC_FLUSH", sync_flush_timeout_ms=300,
                                            writer_sync_in_loop_ms_max=2 if in_loop else -1)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    tracer = None
    try:
        with engine.client(timeout_ms=10_000) as client:
            client.send("slow", [{"body": b"before"}], queue_id=0)
            tracer = inject_into_fdatasync(actor_pids(store_dir)["writer"], "delay_enter=3000ms")
            if in_loop:  # the sync the stall begins in is the loop's (held for it, PUT_OK once done) unless
                # the sync before it took more than 2 ms (the thread's then: FLUSH_DISK_TIMEOUT)
                started = time.monotonic()
                [result] = client.send("slow", [{"body": b"stalled in the loop"}], queue_id=0)
                assert (result["status"], time.monotonic() - started >= 2.5) in (("PUT_OK", True),
                                                                                ("FLUSH_DISK_TIMEOUT", False))
            [result] = client.send("slow", [{"body": b"during"}], queue_id=0)
            assert result["status"] == "FLUSH_DISK_TIMEOUT"
            started = time.monotonic()
            [unwaited] = client.send("slow", [{"body": b"no wait"}], queue_id=0, wait_store=False)
            assert unwaited["status"] == "PUT_OK"  # wait_store=False does not wait for the flush
            # ... and the writer's loop does not wait for its flush thread, stalled on the disk for 3 s
            assert time.monotonic() - started < 1.5
            tracer.kill()
            tracer.wait()
            tracer = None
            deadline = time.monotonic() + 30
            while client.send("slow", [{"body": b"after"}], queue_id=0)[0]["status"] != "PUT_OK":
                assert time.monotonic() < deadline
    finally:
        if tracer is not None:
            tracer.kill()
            tracer.wait()
        assert engine.stop() == 0


def test_under_async_flush_a_failed_flush_of_the_flusher_restarts_it_and_the_writer(store_dir: Path) -> None:
    require(shutil.which("strace") is not None, "strace")
    config = StoreConfig.test_min()
    assert config.flush_mode == "ASYNC_FLUSH"
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    tracer = None
    try:
        client = engine.client(timeout_ms=10_000)
        producer = Producer("p", client, TOPICS, random.Random(3), batch_size=4)
        events = EventStream(store_dir)
        tracer = inject_into_fdatasync(actor_pids(store_dir)["flusher"], "error=EIO")
        deadline = time.monotonic() + 30
        while True:
            producer.send_batch()  # acknowledged at once under ASYNC_FLUSH; the next flush meets the fault
            try:
                flusher_exit = events.wait_for("actor.exited", name="flusher", timeout_ms=100)
            except ControlTimeout:
                assert time.monotonic() < deadline, "the flusher never flushed"
                continue
            break
        assert flusher_exit.exit_code == 71
        assert events.wait_for("actor.exited", name="writer").exit_code == 70
        tracer.kill()
        tracer.wait()
        tracer = None
        events.wait_for("recovery.done", name="writer")
        events.wait_for("recovery.done", name="flusher")
        events.close()
        sends_go_on_and_nothing_is_lost(producer, client)
        client.close()
    finally:
        if tracer is not None:
            tracer.kill()
            tracer.wait()
        assert engine.stop() == 0
    assert check_store(store_dir, config) == []
