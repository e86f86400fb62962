"""A full disk under the timer, the pop state and the transaction actor (a tmpfs; needs root).

Each must refuse what needs new blocks (a DISK_FULL reply, or a checkpoint retried later),
keep running (no restart by the supervisor), and work again once space is freed.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.client import EngineError, StoreClient
from engine.ipc.control import control
from engine.ipc.messages import StatusQuery
from supervisor.launcher import EngineProcess
from tests.helpers import engine_with_topics, size_limited_tmpfs, wait_dispatched
from tests.timer.conftest import timer_config

pytestmark = pytest.mark.timeout(60)

TOPIC = "later"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with size_limited_tmpfs(tmp_path, "48m") as mount_point:
        yield mount_point


def fill(mount_point: Path) -> Path:
    """Take every free block of the file system with one file; returns it (delete it to free them)."""
    ballast = mount_point / "ballast"
    with open(ballast, "ab") as f:
        size = os.fstat(f.fileno()).st_size
        step = 1 << 20
        while step >= 4096:
            try:
                os.posix_fallocate(f.fileno(), size, step)
                size += step
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                step //= 2
    return ballast


def actor(engine: EngineProcess, name: str):
    [found] = [a for a in control(engine.store_dir, StatusQuery()).actors if a.name == name]
    return found


def wait_actor(engine: EngineProcess, name: str, what: str, predicate, *, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while not predicate(found := actor(engine, name)):
        assert time.monotonic() < deadline, f"{name} never reached {what}: restarts {found.restarts}, {found.detail}"
        time.sleep(0.05)  # polling the supervisor's status, with a deadline
    return found


def wait_body(client: StoreClient, body: bytes, *, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        bodies = [m["body"] for q in range(2) for m in client.pull(TOPIC, q, 0, max_messages=64)["messages"]]
        if body in bodies:
            return
        assert time.monotonic() < deadline, f"{body!r} never reached {TOPIC}: {bodies}"
        time.sleep(0.05)  # polling the queue, with a deadline


def test_the_timer_survives_a_full_disk_and_delivers_once_space_is_back(small_disk: Path) -> None:
    with engine_with_topics(small_disk / "store", timer_config(), {TOPIC: 2}) as engine, engine.client() as client:
        client.send(TOPIC, [{"body": b"early"}], delay_ms=200, queue_id=0)
        wait_body(client, b"early")
        ballast = fill(small_disk)
        timer = wait_actor(engine, "timer", "a refused checkpoint", lambda a: a.detail.get("disk_refusals", 0) >= 3
                           or a.restarts > 0)
        assert timer.restarts == 0
        with pytest.raises(EngineError) as refused:
            client.send(TOPIC, [{"body": b"x" * 60_000}] * 60, delay_ms=200, queue_id=0)
        assert refused.value.name == "DISK_FULL"
        ballast.unlink()
        client.send(TOPIC, [{"body": b"late"}], delay_ms=200, queue_id=1)
        wait_body(client, b"late")
        assert actor(engine, "timer").restarts == 0


def test_a_pop_on_a_full_disk_gets_disk_full_and_works_once_space_is_back(small_disk: Path) -> None:
    with engine_with_topics(small_disk / "store", timer_config(), {TOPIC: 2}) as engine, engine.client() as client:
        client.send(TOPIC, [{"body": b"one"}], queue_id=0)
        wait_dispatched(client, timeout_ms=10_000)  # its queue unit is written before the disk fills
        # The group's dead-letter topic and its state for queue 1 exist; queue 0's needs new files.
        assert client.pop("new-group", TOPIC, queue_id=1, invisible_ms=10_000) == []
        ballast = fill(small_disk)
        with pytest.raises(EngineError) as refused:
            client.pop("new-group", TOPIC, queue_id=0, invisible_ms=10_000)
        assert refused.value.name == "DISK_FULL", refused.value
        assert all(a.restarts == 0 for a in control(engine.store_dir, StatusQuery()).actors)
        ballast.unlink()
        reply = client.pop("new-group", TOPIC, queue_id=0, invisible_ms=10_000)
        assert [m["body"] for m in reply] == [b"one"]
        assert all(a.restarts == 0 for a in control(engine.store_dir, StatusQuery()).actors)


@pytest.mark.slow  # 11 s: the default run stays within its 10 minutes
def test_the_transaction_actor_survives_a_full_disk_and_commits_once_space_is_back(small_disk: Path) -> None:
    with engine_with_topics(small_disk / "store", timer_config(), {TOPIC: 2}) as engine, engine.client() as client:
        ballast = fill(small_disk)
        ballast.unlink()  # fill to the last page, then leave one half's room
        with open(ballast, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, max(4096, os.statvfs(small_disk).f_bavail * 4096 - (1 << 20)))
        [result] = client.send(TOPIC, [{"body": b"pay"}], transaction=True, producer_group="payers", queue_id=0)
        fill(small_disk)  # the half is stored; the actor's checkpoint naming it has no room
        found = wait_actor(engine, "transactions", "a refused checkpoint",
                           lambda a: a.detail.get("disk_refusals", 0) >= 2 or a.restarts > 0)
        assert found.restarts == 0
        ballast.unlink()
        assert client.commit(result["msg_id"]) == "commit"
        wait_body(client, b"pay")
        wait_actor(engine, "transactions", "a checkpoint written", lambda a: a.detail["op_next"] >= 1)
        assert actor(engine, "transactions").restarts == 0


def test_a_first_pop_by_a_new_group_on_a_full_disk_gets_disk_full_and_works_once_space_is_back(
        small_disk: Path) -> None:
    """The group's dead-letter topic goes into the topic table, which the full disk refuses to save."""
    with engine_with_topics(small_disk / "store", timer_config(), {TOPIC: 2}) as engine, \
            engine.client(timeout_ms=5_000) as client:
        client.send(TOPIC, [{"body": b"one"}], queue_id=0)
        wait_dispatched(client, timeout_ms=10_000)
        ballast = fill(small_disk)
        started = time.monotonic()
        with pytest.raises(EngineError) as refused:
            client.pop("newcomers", TOPIC, queue_id=0, invisible_ms=10_000)
        assert refused.value.name == "DISK_FULL", refused.value
        assert time.monotonic() - started < 2.0
        front = wait_actor(engine, "front", "a DEGRADED report", lambda a: a.condition != "" or a.restarts > 0)
        assert front.restarts == 0
        assert front.condition == "cannot save the topic table: no space left on device"
        ballast.unlink()
        reply = client.pop("newcomers", TOPIC, queue_id=0, invisible_ms=10_000)
        assert [m["body"] for m in reply] == [b"one"]
        wait_actor(engine, "front", "its table saved", lambda a: a.condition == "")
        assert "%DLQ%newcomers" in (small_disk / "store" / "config" / "topics.json").read_text()
        assert all(a.restarts == 0 for a in control(engine.store_dir, StatusQuery()).actors)
