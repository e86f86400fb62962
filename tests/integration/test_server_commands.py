"""rmqpy-server (python -m supervisor) start, stop and status as a new user meets them.

Each start here is a real supervisor with its actors; every path must end in one
line on stderr and a documented exit status (supervisor/__main__.py EXIT_*), never
a traceback, and "ready" must mean that this start's own supervisor serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine.client import StoreClient
from engine.config import StoreConfig
from engine.ipc import endpoints
from engine.ipc.control import EventStream, control
from engine.ipc.messages import KillCommand
from supervisor.__main__ import build_parser, start_config
from supervisor.launcher import EngineProcess, free_port, write_config
from supervisor.start_checks import listening_addresses

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_root() -> Iterator[Path]:
    """A run-directory root of this test's own (RMQPY_RUN_ROOT), so that looking for engines by
    endpoint sees only the ones started here; short, for ipc socket paths."""
    root = Path(tempfile.mkdtemp(prefix="rq", dir="/tmp"))
    yield root
    leftovers = list(root.iterdir())
    shutil.rmtree(root, ignore_errors=True)
    assert not leftovers, f"run directories left behind: {leftovers}"


def server(*args: str, cwd: Path | None = None, run_root: Path | None = None) -> subprocess.CompletedProcess[str]:
    """python -m supervisor ARGS, run from ``cwd`` (this checkout's code wherever that is)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if run_root is not None:
        env["RMQPY_RUN_ROOT"] = str(run_root)
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True, text=True, timeout=60,
                          check=False, cwd=cwd or REPO, env=env)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def config_file(tmp_path: Path, **changes: object) -> Path:
    config = StoreConfig.test_min().replace(**changes) if changes else StoreConfig.test_min()
    return write_config(tmp_path / "engine.toml", config)


def start_detached(store: Path, config: Path, port: int, run_root: Path | None = None) -> int:
    started = server("start", "--detach", "--store-dir", str(store), "--config", str(config),
                     "--endpoint", f"tcp://127.0.0.1:{port}", run_root=run_root)
    assert started.returncode == 0, started.stderr
    pid = int(started.stdout.split("pid=")[1])
    return pid


@pytest.mark.timeout(90)
def test_a_start_on_a_store_already_held_fails_at_once_naming_the_engine(store_dir: Path, tmp_path: Path) -> None:
    config = config_file(tmp_path)
    with EngineProcess(store_dir, config=StoreConfig.test_min()) as first:
        port = free_port()
        for mode in (["--detach"], []):
            began = time.monotonic()
            again = server("start", *mode, "--store-dir", str(store_dir), "--config", str(config),
                           "--endpoint", f"tcp://127.0.0.1:{port}")
            took_s = time.monotonic() - began
            assert again.returncode == 4, (mode, again.stdout, again.stderr)
            assert "ready" not in again.stdout, f"{mode}: said ready for the engine already there: {again.stdout}"
            assert one_line_error(again) == (f"error: another engine (pid {first.pid}) is running on "
                                             f"{store_dir.resolve()} at {first.endpoint}")
            assert took_s < 5, f"{mode}: refused only after {took_s:.1f} s"
            assert not listening(port)
        with first.client() as client:
            assert client.send("still", [{"body": b"the first engine serves on"}])


@pytest.mark.timeout(60)
def test_a_start_on_a_port_in_use_names_the_setting_and_address_and_leaves_no_store(tmp_path: Path) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        store = tmp_path / "store"
        config = config_file(tmp_path, metrics_endpoint=f"127.0.0.1:{port}")
        for mode in (["--detach"], []):
            failed = server("start", *mode, "--store-dir", str(store), "--config", str(config),
                            "--endpoint", f"tcp://127.0.0.1:{free_port()}")
            assert failed.returncode == 1, (mode, failed.stdout, failed.stderr)
            assert one_line_error(failed) == f"error: Address already in use: 127.0.0.1:{port} (metrics_endpoint)"
            assert not store.exists(), f"{mode}: the refused start left {sorted(p.name for p in store.iterdir())}"
        in_use = server("start", "--detach", "--store-dir", str(store), "--config", str(config_file(tmp_path)),
                        "--endpoint", f"tcp://127.0.0.1:{port}")
        assert in_use.returncode == 1
        assert one_line_error(in_use) == f"error: Address already in use: 127.0.0.1:{port} (endpoint)"
        assert not store.exists()
    finally:
        taken.close()


@pytest.mark.timeout(60)
def test_a_store_directory_that_cannot_be_made_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = blocker / "store"
    config = config_file(tmp_path)
    for mode in (["--detach"], []):
        failed = server("start", *mode, "--store-dir", str(store), "--config", str(config),
                        "--endpoint", f"tcp://127.0.0.1:{free_port()}")
        assert failed.returncode == 1, (mode, failed.stderr)
        assert one_line_error(failed).startswith(f"error: cannot use the store directory {store}: Not a directory")
    for command in ("status", "stop"):
        none = server(command, "--store-dir", str(store))
        assert none.returncode == 3 and "Traceback" not in none.stderr, none.stderr


def kill_for_good(store: Path, actor: str) -> None:
    """Kill ``actor`` of an engine whose restart_count_max is 0; returns once the supervisor gave it up."""
    events = EventStream(store)
    try:
        assert control(store, KillCommand(actor)).ok
        events.wait_for("actor.gave_up", name=actor, timeout_ms=20_000)
    finally:
        events.close()


@pytest.mark.timeout(60)
def test_stop_after_an_unclean_stop_says_so_with_status_5(tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = config_file(tmp_path, restart_count_max=0)  # a killed actor stays down: the stop cannot be clean
    start_detached(store, config, free_port())
    try:
        kill_for_good(store, "timer")
    finally:
        stopped = server("stop", "--store-dir", str(store))
    assert (stopped.returncode, stopped.stdout.strip()) == (5, "stopped (not cleanly; the next start recovers)"), \
        (stopped.stdout, stopped.stderr)
    assert (store / "abort").exists()
    foreground = EngineProcess(store, config=StoreConfig.test_min().replace(restart_count_max=0))
    foreground.start()  # recovers, then the same unclean stop in the foreground
    try:
        kill_for_good(store, "timer")
    finally:
        code = foreground.stop()
    assert code == 5
    assert b"stopped (not cleanly; the next start recovers)" in foreground.output


def test_status_and_stop_find_the_engine_from_another_directory(tmp_path: Path, run_root: Path) -> None:
    store = tmp_path / "store"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    pid = start_detached(store, config_file(tmp_path), port, run_root)
    try:
        began = time.monotonic()
        none = server("status", cwd=elsewhere, run_root=run_root)
        took_s = time.monotonic() - began
        assert none.returncode == 3
        assert none.stdout.strip() == (f"no engine is running on {elsewhere / 'store'}, nor any serving "
                                       f"tcp://127.0.0.1:10911")
        assert took_s < 3, f"'no engine' took {took_s:.1f} s"
        found = server("status", "--endpoint", endpoint, cwd=elsewhere, run_root=run_root)
        assert found.returncode == 0, found.stderr
        assert found.stdout.splitlines()[0] == f"engine RUNNING on {endpoint} store={store} pid={pid} role=standalone"
        here = server("status", cwd=tmp_path, run_root=run_root)  # ./store
        assert here.returncode == 0 and f"store={store}" in here.stdout
    finally:
        stopped = server("stop", "--endpoint", endpoint, cwd=elsewhere, run_root=run_root)
    assert (stopped.returncode, stopped.stdout.strip()) == (0, "stopped"), stopped.stderr
    assert not psutil.pid_exists(pid)


@pytest.mark.slow
def test_a_hung_supervisor_gives_one_line_and_status_6(tmp_path: Path) -> None:
    store = tmp_path / "store"
    # Heartbeats of the 5 s pause, read late, must not look like hung actors: then the stop is clean.
    pid = start_detached(store, config_file(tmp_path, heartbeat_timeout_ms=60_000), free_port())
    os.kill(pid, signal.SIGSTOP)
    try:
        hung = server("status", "--store-dir", str(store))
    finally:
        os.kill(pid, signal.SIGCONT)
        stopped = server("stop", "--store-dir", str(store))
    assert hung.returncode == 6
    assert one_line_error(hung) == f"error: the supervisor (pid {pid}) of {store} did not answer within 5 s"
    assert stopped.returncode == 0, stopped.stderr


@pytest.mark.slow  # 6 s: a supervisor killed, its actors waited out
def test_a_killed_supervisor_is_reported_at_once_without_a_traceback(tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = config_file(tmp_path)
    port = free_port()
    pid = start_detached(store, config, port)
    actors = psutil.Process(pid).children()
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(pid)], timeout=10)
    try:
        for command in ("status", "stop"):
            began = time.monotonic()
            dead = server(command, "--store-dir", str(store))
            assert time.monotonic() - began < 3, f"{command} waited for the dead supervisor"
            assert dead.returncode == 3, (command, dead.stdout, dead.stderr)
            assert "Traceback" not in dead.stderr
            assert f"its supervisor, pid {pid}, is gone" in dead.stdout + dead.stderr
    finally:
        for actor in actors:  # as in a power cut (those still there); the next start recovers
            with contextlib.suppress(psutil.NoSuchProcess):
                actor.kill()
        psutil.wait_procs(actors, timeout=10)
    start_detached(store, config, port)  # recovers; removes what the killed one left
    assert server("stop", "--store-dir", str(store)).returncode == 0
    assert not endpoints.run_dir_for(store).exists()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("module", ["supervisor", "engine"])
def test_both_commands_tell_their_version(module: str) -> None:
    from engine.version import package_version

    told = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=20,
                          check=False, cwd=REPO)
    assert told.returncode == 0, told.stderr
    assert told.stdout.strip() == f"python -m {module} {package_version()}"
    assert package_version()[0].isdigit()


def test_message_ids_carry_the_port_of_the_endpoint_set_in_the_config_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    port = free_port()
    config = write_config(tmp_path / "engine.toml", StoreConfig.test_min())
    lines = [line for line in config.read_text().splitlines()
             if not line.startswith(("store_port ", "endpoint "))] + [f'endpoint = "tcp://127.0.0.1:{port}"']
    config.write_text("\n".join(lines) + "\n")
    started = server("start", "--detach", "--store-dir", str(store), "--config", str(config))
    assert started.returncode == 0, started.stderr
    try:
        with StoreClient(f"tcp://127.0.0.1:{port}", timeout_ms=10_000) as client:
            [result] = client.send("ids", [{"body": b"where am I"}])
    finally:
        assert server("stop", "--store-dir", str(store)).returncode == 0
    assert result["msg_id"][8:16] == f"{port:08X}", result["msg_id"]  # STOREHOST: 4 bytes of IP, 4 of port


def test_status_shows_the_pid_of_the_running_supervisor(engine: EngineProcess) -> None:
    """The supervisor's pid (its state file's): what to signal, or to look for in ps, with no
    other file to read; the same in the text and in --json."""
    text = server("status", "--store-dir", str(engine.store_dir))
    assert text.returncode == 0, text.stderr
    first = text.stdout.splitlines()[0]
    assert first == f"engine RUNNING on {engine.endpoint} store={engine.store_dir} pid={engine.process.pid} " \
                    f"role=standalone", text.stdout
    shown = server("status", "--store-dir", str(engine.store_dir), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["pid"] == engine.process.pid
    assert psutil.Process(engine.process.pid).cmdline()[1:4] == ["-m", "supervisor", "start"]


def start_example(line: str) -> StoreConfig:
    """The settings a `start --help` example line runs with, read as `start` reads them."""
    words = shlex.split(line, comments=True)
    assert words[:4] == ["python", "-m", "supervisor", "start"], line
    return start_config(build_parser().parse_args(words[3:]))


@pytest.mark.timeout(30)
def test_the_help_examples_of_a_first_and_a_second_store_can_run_together() -> None:
    """`start --help` shows a start of ./store with every default and one of a second store on the same
    machine: the second must bind none of the first's ports (every one a start checks, in
    start_checks.listening_addresses), or it fails while the first runs."""
    shown = server("start", "--help")
    assert shown.returncode == 0, shown.stderr
    examples = shown.stdout.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    first = start_example(next(line for line in examples if "--store-dir" not in line))
    second = start_example(next(line for line in examples if "second-store" in line))
    first_ports = {address for _, address in listening_addresses(first)}
    second_ports = {address for _, address in listening_addresses(second)}
    assert {"127.0.0.1:10911", "127.0.0.1:9108"} <= first_ports  # the defaults, metrics on
    assert not first_ports & second_ports, (first_ports, second_ports)
