"""Store timestamps never go back, whatever the host's wall clock does (docs/design.md, section 3,
step 7: ``max(now, last store timestamp)``), also across a restart: the writer's recovery takes
the last from the checkpoint when it scans no record. The engine's clock is moved by Debian's
libfaketime (``harness/testbed/clock.py``), on loopback."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.config import StoreConfig
from harness.testbed import clock
from supervisor.launcher import EngineProcess
from tests.helpers import require, wait_dispatched

HOUR_MS = 3_600_000


@pytest.mark.timeout(120)
def test_store_times_stay_level_after_a_clock_set_back_an_hour_across_a_clean_restart(tmp_path: Path) -> None:
    require(clock.library() is not None, "libfaketime (Debian's faketime)")
    clocks = clock.HostClocks(tmp_path, ["engine"])
    clocks.start()
    clocks.set("engine", HOUR_MS // 1000)
    wrapper = ["env", *(f"{k}={v}" for k, v in clocks.environment("engine").items())]
    engine = EngineProcess(tmp_path / "store", config=StoreConfig.test_min(), wrapper=wrapper)
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("times", queue_count=1)
            ahead = client.send("times", [{"body": b"an hour ahead"}])[0]["store_timestamp"]
        assert ahead > time.time() * 1000 + HOUR_MS - 60_000, ahead  # stamped by the engine's clock
        engine.stop()  # clean: the next start scans no record
        clocks.set("engine", 0)
        engine.start()
        with engine.client() as client:
            after = client.send("times", [{"body": b"the clock set right"}])[0]["store_timestamp"]
            wait_dispatched(client)  # in its queue before it is read back
            stamps = [m["store_timestamp"] for m in client.pull("times", 0, 0, max_messages=8)["messages"]]
        assert after >= ahead and stamps == [ahead, after], (ahead, after, stamps)
    finally:
        engine.stop()
