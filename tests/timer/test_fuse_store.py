"""The store on a FUSE mount (bindfs, a pass-through of a local directory): the actors share its
files through mmap, so the timer delivers as on a local disk when the mount goes through the page
cache, and the engine refuses to start, naming the reason, on one mounted with direct_io."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from supervisor.launcher import EngineFailed, EngineProcess
from tests.helpers import engine_with_topics, require
from tests.timer.conftest import TOPIC, timer_config
from tests.timer.test_delayed import wait_messages, wall_ms

pytestmark = pytest.mark.timeout(60)


@contextmanager
def bindfs_mount(base: Path, *options: str) -> Iterator[Path]:
    """A bindfs pass-through of a new directory, run in the foreground as our child; unmounted and
    waited for at the end."""
    require(shutil.which("bindfs") is not None and shutil.which("fusermount3") is not None, "bindfs")
    require(os.access("/dev/fuse", os.R_OK | os.W_OK), "/dev/fuse")
    source, mount = base / "source", base / "mount"
    source.mkdir(parents=True)
    mount.mkdir()
    bindfs = subprocess.Popen(["bindfs", "-f", *options, str(source), str(mount)], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not os.path.ismount(mount):
            assert bindfs.poll() is None, f"bindfs exited with {bindfs.returncode}"
            assert time.monotonic() < deadline, "bindfs did not mount within 10 s"
            time.sleep(0.02)
        yield mount
    finally:
        unmounted = subprocess.run(["fusermount3", "-u", str(mount)], check=False, timeout=10)
        if unmounted.returncode and os.path.ismount(mount):
            subprocess.run(["fusermount3", "-u", "-z", str(mount)], check=False, timeout=10)  # busy: detach it
        try:
            bindfs.wait(timeout=10)
        except subprocess.TimeoutExpired:
            bindfs.kill()
            bindfs.wait()


def test_on_a_fuse_mount_the_timer_delivers_or_the_engine_refuses_with_the_reason(tmp_path: Path) -> None:
    # Through the page cache (bindfs's default): every delayed message arrives once, at its time.
    with bindfs_mount(tmp_path / "cached") as mount, \
            engine_with_topics(mount / "store", timer_config(flush_mode="SYNC_FLUSH"), {TOPIC: 2}) as engine, \
            engine.client() as client:
        sent_ms = wall_ms()
        delays = {n: 800 + 40 * n for n in range(20)}
        for n, delay in delays.items():
            client.send(TOPIC, [{"body": b"%d" % n}], queue_id=n % 2, delay_ms=delay)
        messages = wait_messages(client, 0, 10) + wait_messages(client, 1, 10)
        assert sorted(int(bytes(m["body"])) for m in messages) == sorted(delays)
        for message in messages:
            assert message["store_timestamp"] >= sent_ms + delays[int(bytes(message["body"]))]
    # direct_io: mmap(MAP_SHARED) fails with ENODEV. The first actor to map a file died while starting
    # with "No such device"; now the supervisor refuses before any actor starts, and says why.
    with bindfs_mount(tmp_path / "direct", "-o", "direct_io") as mount:
        engine = EngineProcess(mount / "store", config=timer_config())
        with pytest.raises(EngineFailed) as failed:
            engine.start()
        output = str(failed.value)
        assert "error: the file system of" in output
        assert "cannot share mapped files between processes (mmap(MAP_SHARED) fails: No such device)" in output
        assert "without direct_io" in output
        assert " started (pid" not in output  # refused before any actor started
        assert not (mount / "store" / ".mapping-probe").exists()
