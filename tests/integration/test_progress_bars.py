"""Progress bars are drawn for a person at a terminal, and for nobody else.

``rmqpy produce`` runs with its stderr on a pseudo-terminal (as in a shell), then on a pipe (as
in a script), then on the terminal with ``--json``; the Spark driver's bar follows the tasks
of real jobs on a local session.
"""

from __future__ import annotations

import fcntl
import os
import pty
import selectors
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.progress import SparkJobBar
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(180)

RMQPY = str(Path(sys.executable).parent / "rmqpy")


def produce_on_a_terminal(engine: EngineProcess, *extra: str) -> tuple[str, str, int]:
    """Run ``rmqpy produce`` with stderr on a pty; returns (what the terminal showed, stdout, exit code).

    The topic is made first: a produce that creates it says so on stderr."""
    with engine.client() as client:
        client.create_topic("bars")
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # as a terminal window has
    command = [RMQPY, "produce", "--endpoint", engine.endpoint, "--topic", "bars", "--count", "3000",
               "--batch-size", "100", *extra]
    # stdout into a file: --json prints more than a pipe holds, and only the terminal is read here
    with tempfile.TemporaryFile() as stdout_file, \
            subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout_file, stderr=terminal) as process:
        os.close(terminal)
        shown = b""
        with selectors.DefaultSelector() as selector:
            selector.register(controller, selectors.EVENT_READ)
            deadline = time.monotonic() + 60
            while True:  # read what the terminal shows until the command has exited and all is read
                if not selector.select(0.1):
                    if process.poll() is not None:
                        break
                    assert time.monotonic() < deadline, f"produce did not end: {shown!r}"
                    continue
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: every holder of the terminal closed it (the command exited)
                    break
                if not chunk:
                    break
                shown += chunk
        code = process.wait(60)
        stdout_file.seek(0)
        stdout = stdout_file.read().decode()
    os.close(controller)
    return shown.decode(errors="replace"), stdout, code


def test_produce_draws_a_bar_on_a_terminal(engine: EngineProcess) -> None:
    shown, stdout, code = produce_on_a_terminal(engine)
    assert code == 0, shown
    assert "produce" in shown and "100%" in shown and "3.00k/3.00k" in shown, shown
    assert stdout.startswith("sent 3000 messages in "), stdout


def test_produce_prints_nothing_extra_without_a_terminal(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("bars")  # a produce that creates it says so on stderr
    done = subprocess.run([RMQPY, "produce", "--endpoint", engine.endpoint, "--topic", "bars", "--count", "3000",
                           "--batch-size", "100"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("sent 3000 messages in "), done.stdout


def test_produce_with_json_draws_no_bar_even_on_a_terminal(engine: EngineProcess) -> None:
    shown, stdout, code = produce_on_a_terminal(engine, "--json")
    assert code == 0, shown
    assert shown == ""
    assert '"sent": 3000' in stdout


def test_inspect_and_repair_report_their_progress_through_the_log(store_dir: Path) -> None:
    """The long reads of the log (inspect, check --repair) report bytes read up to the whole,
    in steps, so a terminal shows a bar that moves (``StageBars`` draws it)."""
    from engine.config import StoreConfig
    from engine.offline.inspect_store import inspect_store
    from engine.offline.repair import rebuild_derived

    config = StoreConfig.test_min().replace(segment_size_bytes=1 << 20, message_body_bytes_max=64 << 10)
    with EngineProcess(store_dir, config=config) as engine, engine.client() as client:
        for n in range(12):  # about 3 MiB: three segments
            client.send("bars", [{"body": b"x" * 2500, "keys": [f"k{n}-{i}"]} for i in range(100)])
    for run in (lambda progress: inspect_store(store_dir, progress=progress),
                lambda progress: rebuild_derived(store_dir, config, progress=progress)):
        calls: list[tuple[str, int, int]] = []
        run(lambda stage, done, total, calls=calls: calls.append((stage, done, total)))
        assert {stage for stage, _, _ in calls} == {"log"}
        done = [d for _, d, _ in calls]
        total = calls[-1][2]  # the log's segments, to the end of the last (1 MiB each)
        assert done == sorted(done) and done[-1] == total and total % (1 << 20) == 0 and total >= 3 << 20, calls


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """The run's session if there is one (tests/spark's), else a small one of our own, stopped at the end."""
    from pyspark.sql import SparkSession

    from engine.spark.session import build_session, stop_session

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    session = build_session(master="local[2]", app_name="rmq-progress-tests", driver_memory="512m")
    try:
        yield session
    finally:
        stop_session(session)


@pytest.mark.slow
def test_the_spark_bar_counts_the_tasks_of_the_jobs_it_covers(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    context = spark.sparkContext
    spark.range(0, 10, numPartitions=2).count()  # before the bar: not counted
    with SparkJobBar(context, desc="export", enabled=True) as bar:
        spark.range(0, 100_000, numPartitions=5).selectExpr("sum(id)").collect()
        spark.range(0, 10, numPartitions=3).collect()
    done, total = bar.tasks()
    assert done == total >= 5 + 3, (done, total)  # 5 + 3 scan tasks, and the sum's final task
    shown = capsys.readouterr().err
    assert "export: 100%" in shown and f"{total}/{total}" in shown, shown
    assert context.getLocalProperty("spark.jobGroup.id") is None, "the bar's job group is removed after it"
    with SparkJobBar(context, desc="export"):  # stderr is not a terminal under pytest: quiet
        spark.range(0, 10, numPartitions=2).count()
    assert capsys.readouterr().err == ""
