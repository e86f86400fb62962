"""Helpers for tests that talk to a live engine."""

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.config import StoreConfig
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

__all__ = ["engine_with_topics", "issue_certificate", "make_authority", "parked_requests", "require",
           "size_limited_tmpfs", "wait_dispatched"]

# Set by .ci/run: a test whose prerequisite (a client driver, a browser, strace) is missing fails
# there, where `make test` installs everything; elsewhere it is skipped and listed by pytest's -ra.
REQUIRE_ALL = os.environ.get("RMQ_TESTS_REQUIRE_ALL") == "1"


def _openssl(*words: str) -> None:
    subprocess.run(["openssl", *words], check=True, capture_output=True, timeout=60)


def make_authority(directory: Path, name: str = "test-ca") -> tuple[Path, Path]:
    """A CA of the test's own, made with openssl: (certificate, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
             "-keyout", str(key), "-out", str(cert))
    return cert, key


def issue_certificate(directory: Path, name: str, ca: tuple[Path, Path], *, hosts: str = "") -> tuple[Path, Path]:
    """A certificate for CN=``name`` signed by ``ca``: (certificate, key); ``hosts``: its subjectAltName
    ("IP:127.0.0.1,DNS:localhost" for a server)."""
    cert, key, request = directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(request),
             *(["-addext", f"subjectAltName={hosts}"] if hosts else []))
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", "1", "-copy_extensions", "copyall", "-out", str(cert))
    return cert, key


def wait_until(what: str, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Until ``condition()`` holds, failing with ``what`` past ``timeout_s``: for state that only
    files and other processes' answers show (an audit line, a file another process writes), which
    signal nothing to wait on; looked at every 50 ms."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def require(present: bool, what: str) -> None:
    """Skip the test (fail it under RMQ_TESTS_REQUIRE_ALL=1) unless ``what`` is installed."""
    if present:
        return
    import pytest

    message = f"{what} is not installed (make clients / make system-tools install it as root)"
    if REQUIRE_ALL:
        pytest.fail(message)
    pytest.skip(message)


@contextmanager
def engine_with_topics(store_dir: Path, config: StoreConfig, topics: dict[str, int]) -> Iterator[EngineProcess]:
    """A started engine with these topics (name -> queue count), stopped at the end."""
    process = EngineProcess(store_dir, config=config)
    process.start()
    try:
        with process.client() as client:
            for topic, queues in topics.items():
                client.create_topic(topic, queue_count=queues)
        yield process
    finally:
        process.stop()


def parked_requests(engine: EngineProcess) -> int:
    """Pulls and pops parked (long polling) at the owners, from their heartbeats."""
    from engine.ipc.control import control
    from engine.ipc.messages import StatusQuery

    return sum(a.detail.get("parked_pulls", 0) for a in control(engine.store_dir, StatusQuery()).actors)


@contextmanager
def size_limited_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's size=, e.g. "24m") mounted under ``tmp_path``; skips without root."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
