"""A bare ``status`` or ``stop`` (no ``--store-dir``) finds only an engine of its own network
namespace: the run directories under ``RUN_DIR_ROOT`` are shared with other namespaces, whose
``tcp://127.0.0.1:10911`` is not this one's (engine/ipc/control.py, ``find_engine``)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engine.config import StoreConfig
from engine.ipc.control import DEFAULT_ENDPOINT
from engine.ipc.endpoints import read_engine_state
from supervisor.launcher import write_config

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                 reason="a network namespace of the test's own needs root and ip(8)")]

SUPERVISOR = [sys.executable, "-m", "supervisor"]


def supervisor(*args: str, cwd: Path, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    inside = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*inside, *SUPERVISOR, *args], capture_output=True, text=True, timeout=90, check=False,
                          cwd=cwd)


def test_a_bare_status_or_stop_leaves_another_network_namespaces_engine_alone(tmp_path: Path) -> None:
    netns = f"rmqpy-test-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", netns], check=True, timeout=30)
    store = tmp_path / "store"
    try:
        subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up"], check=True, timeout=30)
        config = write_config(tmp_path / "engine.toml", StoreConfig.test_min())
        started = supervisor("start", "--detach", "--store-dir", str(store), "--config", str(config),
                             "--endpoint", DEFAULT_ENDPOINT, cwd=tmp_path, netns=netns)  # its own 127.0.0.1
        assert started.returncode == 0, started.stderr
        pid = read_engine_state(store)["pid"]
        assert isinstance(pid, int)
        elsewhere = tmp_path / "elsewhere"  # no ./store here: a bare command searches the run directories
        elsewhere.mkdir()
        status = supervisor("status", cwd=elsewhere)
        assert str(store) not in status.stdout + status.stderr, status.stdout
        if status.returncode == 0:
            pytest.skip(f"an engine of this namespace serves {DEFAULT_ENDPOINT}: a bare stop would stop it")
        stop = supervisor("stop", cwd=elsewhere)
        assert stop.returncode == 3, (stop.stdout, stop.stderr)  # EXIT_NOT_RUNNING
        assert psutil.pid_exists(pid), "the bare stop stopped the other namespace's engine"
        inside = supervisor("status", cwd=elsewhere, netns=netns)  # from its own namespace, a bare status finds it
        assert inside.returncode == 0 and f"store={store}" in inside.stdout, inside.stdout
    finally:
        stopped = supervisor("stop", "--store-dir", str(store), cwd=tmp_path)
        subprocess.run(["ip", "netns", "del", netns], check=False, timeout=30)
    assert stopped.stdout.strip() == "stopped", (stopped.stdout, stopped.stderr)
