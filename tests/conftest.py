"""Shared fixtures: a real engine (supervisor and actor processes) on a temporary store.

Every test that starts processes is checked afterwards: no process whose
command line names the test's directory may survive it, and the engine's
run directory (its ipc sockets) must be gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine.config import StoreConfig
from engine.ipc import endpoints
from supervisor.launcher import EngineProcess


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes(tmp_path: Path) -> Iterator[None]:
    yield
    leftovers = processes_mentioning(str(tmp_path))
    for proc in leftovers:
        proc.kill()
    assert not leftovers, f"processes left behind: {[(p.pid, p.info['cmdline']) for p in leftovers]}"
    for store in tmp_path.iterdir():
        assert not endpoints.run_dir_for(store).exists(), f"run directory (ipc sockets) left behind for {store}"


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def engine(store_dir: Path) -> Iterator[EngineProcess]:
    process = EngineProcess(store_dir, config=StoreConfig.test_min())
    process.start()
    try:
        yield process
    finally:
        process.stop()
