"""The broker membership actor as the supervisor runs it: a start that waits for the role it tells
(``RoleChanged``), and a spare process that a restart lets through, so a killed membership
actor renews its lease within it (docs/design.md 8.1, ``KeepSpare``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.ipc.control import EventStream
from harness.broker_set import broker_set
from harness.faults import actor_pids, processes_running
from supervisor.etcd_server import ETCD
from tests.helpers import require

pytestmark = pytest.mark.timeout(120)


def test_a_killed_membership_actor_restarts_as_its_spare_and_the_master_keeps_its_epoch(tmp_path: Path) -> None:
    require(ETCD, "etcd-server")
    with broker_set(tmp_path, StoreConfig.test_min(), engines=1) as brokers:
        master = brokers.wait_master()
        epoch = brokers.role(master).epoch  # type: ignore[union-attr]
        for _ in range(2):
            running = actor_pids(master.store_dir)["membership"]
            spares = processes_running(master.pid, "engine.actors.broker_membership") - {running}
            assert len(spares) == 1, f"one spare waits beside the running membership actor: {spares}"
            events = EventStream(master.store_dir)
            try:
                os.kill(running, signal.SIGKILL)
                restarted = events.wait_for("actor.running", name="membership", timeout_ms=30_000)
            finally:
                events.close()
            assert restarted.pid in spares, "the restart took the spare, not a new interpreter"
        assert brokers.master() is master and brokers.role(master).epoch == epoch  # type: ignore[union-attr]
