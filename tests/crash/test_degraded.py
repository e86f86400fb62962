"""An engine that cannot store a message says so (a tmpfs, mounted for the test; needs root).

A store directory it cannot write refuses the start, naming it. A disk too full at start,
or one that fills while it runs, leaves the engine DEGRADED with the reason: in the ready
line, ``status``, ``/healthz``, the metrics and the dashboard; RUNNING again once space
is freed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.client import EngineError
from engine.config import StoreConfig
from engine.ipc.control import control
from engine.ipc.messages import ControlReply, StatusQuery
from supervisor.launcher import EngineFailed, EngineProcess
from tests.crash.test_disk_full_actors import fill
from tests.helpers import size_limited_tmpfs
from tests.monitor.conftest import Monitored, monitored_engine, value

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with size_limited_tmpfs(tmp_path, "48m") as mount_point:
        yield mount_point


def wait_status(engine: EngineProcess, what: str, predicate, *, timeout_s: float = 20.0) -> ControlReply:
    deadline = time.monotonic() + timeout_s
    while not predicate(status := control(engine.store_dir, StatusQuery())):
        assert time.monotonic() < deadline, f"the engine never became {what}: {status.state} {status.reasons}"
        time.sleep(0.05)  # polling the supervisor's status, with a deadline
    return status


def health(monitored: Monitored) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{monitored.dashboard_url}/healthz", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_start_on_a_read_only_commitlog_is_refused_naming_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    store = tmp_path / "store"
    commitlog = store / "commitlog"
    commitlog.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(commitlog)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        engine = EngineProcess(store, start_timeout_s=30)
        try:
            with pytest.raises(EngineFailed) as failed:
                engine.start()
        finally:
            if engine.process is not None and engine.process.poll() is None:
                engine.stop()  # the old behaviour: it started, with every send refused
        lines = [line for line in str(failed.value).splitlines() if line.startswith("error:")]
        assert lines == [f"error: cannot write in the store directory {commitlog}: Read-only file system"], \
            str(failed.value)
        assert not (store / "abort").exists()
    finally:
        subprocess.run(["umount", "-l", str(commitlog)], check=False)


def test_a_disk_too_full_at_start_starts_degraded_and_says_why(small_disk: Path) -> None:
    ballast = small_disk / "ballast"
    with open(ballast, "wb") as f:  # past disk_space_warning_level_ratio (90 %), with room to start
        os.posix_fallocate(f.fileno(), 0, int(os.statvfs(small_disk).f_blocks * 4096 * 0.95))
    config = StoreConfig.test_min().replace(clean_resource_interval_ms=100)
    with EngineProcess(small_disk / "store", config=config) as engine:
        # start() returns at the log line "engine ready on ..."; the ready line follows, in one write.
        assert engine._read_until(b"\nready ", 10), engine.output
        [ready] = [line for line in engine.output.decode().splitlines() if line.startswith("ready ")]
        assert re.fullmatch(rf"ready {engine.endpoint} store=\S+ DEGRADED: writer: sends refused: the disk is "
                            r"9\d% used, past disk_space_warning_level_ratio \(90%\)", ready), ready
        ballast.unlink()
        status = wait_status(engine, "RUNNING", lambda s: s.state == "RUNNING")
        assert status.reasons == []
        with engine.client() as client:
            client.create_topic("t", queue_count=1)
            assert client.send("t", [{"body": b"x"}], queue_id=0)[0]["status"] == "PUT_OK"


def test_a_disk_that_fills_while_running_degrades_the_engine_until_space_is_freed(small_disk: Path) -> None:
    # The used-space ratio never refuses here: the writer's appends find the disk full.
    with monitored_engine(small_disk / "store", disk_space_warning_level_ratio=1.0) as monitored:
        engine = monitored.engine
        assert health(monitored)[0] == 200
        with engine.client() as client:
            client.create_topic("t", queue_count=1)
            ballast = fill(small_disk)
            with pytest.raises(EngineError) as refused:
                for _ in range(100):  # the segment's blocks reserved ahead take the first sends
                    client.send("t", [{"body": b"x" * 60_000}] * 4, queue_id=0)
            assert refused.value.name == "DISK_FULL"
            status = wait_status(engine, "DEGRADED", lambda s: s.state == "DEGRADED")
            full = re.compile(r"writer: cannot append: disk full \(need \d+ bytes, \d+ free\)")
            assert any(full.fullmatch(reason) for reason in status.reasons), status.reasons
            code, body = health(monitored)  # the timer may also say its files are refused: any order
            assert code == 503 and body.splitlines()[0] == "DEGRADED", body
            assert any(full.fullmatch(line) for line in body.splitlines()), body
            samples = monitored.wait_scrape(lambda s: value(s, "rmqpy_engine_degraded") == 1)
            assert value(samples, "rmqpy_actor_condition", actor="writer") == 1
            assert any(full.fullmatch(reason) for reason in monitored.api("/api/overview")[1]["reasons"])
            shown = subprocess.run([sys.executable, "-m", "supervisor", "status", "--store-dir", str(engine.store_dir)],
                                   capture_output=True, text=True, check=False, timeout=30)
            first = shown.stdout.splitlines()[0]
            assert first == (f"engine DEGRADED on {engine.endpoint} store={engine.store_dir} pid={engine.process.pid} "
                             f"role=standalone"), \
                shown.stdout
            assert any(line.startswith("  degraded: writer: cannot append: disk full (need ")
                       for line in shown.stdout.splitlines()[1:]), shown.stdout
            ballast.unlink()
            wait_status(engine, "RUNNING again", lambda s: s.state == "RUNNING" and not s.reasons)
            assert health(monitored) == (200, "RUNNING\n")
            monitored.wait_scrape(lambda s: value(s, "rmqpy_engine_degraded") == 0
                                  and value(s, "rmqpy_actor_condition", actor="writer") == 0)
            assert client.send("t", [{"body": b"after"}], queue_id=0)[0]["status"] == "PUT_OK"
        assert all(a.restarts == 0 for a in control(engine.store_dir, StatusQuery()).actors)
