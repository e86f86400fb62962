"""``rmqpy-server cluster``: a master and two replicas started by one command, their roles and lag
shown, a message sent to the master read from a replica, and all of it stopped by one command."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.client import StoreClient
from supervisor.launcher import free_port

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # three engines started and stopped: 14 s


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "cluster", *args], capture_output=True, text=True,
                          timeout=90, check=False)


def test_one_command_starts_a_master_and_its_replicas_and_one_stops_them(tmp_path: Path) -> None:
    port = free_port()
    directory = tmp_path / "cluster"
    started = cluster("start", "--dir", str(directory), "--replicas", "2", "--port", str(port))
    try:
        assert started.returncode == 0, started.stderr
        assert [line.split()[0] for line in started.stdout.splitlines()[:3]] == ["master", "replica-1", "replica-2"]
        with StoreClient(f"tcp://127.0.0.1:{port}") as master:
            master.send("demo", [{"body": b"hello", "keys": ["k1"]}])
        deadline = time.monotonic() + 30
        found: list[dict[str, object]] = []
        with StoreClient(f"tcp://127.0.0.1:{port + 20}") as replica:
            while not found:
                assert time.monotonic() < deadline, "the replica never served the master's message"
                try:
                    found = replica.query_by_key("demo", "k1")
                except Exception:
                    continue
        assert found[0]["body"] == b"hello"
        shown = cluster("status", "--dir", str(directory))
        roles = [line.split()[3] for line in shown.stdout.splitlines()]
        assert roles == ["master", "replica", "replica"], shown.stdout
    finally:
        stopped = cluster("stop", "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert [line.split()[1] for line in stopped.stdout.splitlines()] == ["stopped"] * 3
