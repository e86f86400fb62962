"""Run ``python -m supervisor start`` as a child process: for tests, scripts and benchmarks.

    with EngineProcess(store_dir, config=StoreConfig.test_min(), port=free_port()) as engine:
        client = engine.client()
        ...

``start()`` returns once the engine printed its ready line (or raises with the
supervisor's output); ``stop()`` sends SIGINT, the same path as Ctrl-C, and
waits for the whole process tree to exit.

The engine dies with the process that started it, even if that process is
SIGKILLed and runs no ``finally``: the supervisor is started with
``--die-with-parent <our pid>``, so the kernel sends it SIGTERM when we die
(PR_SET_PDEATHSIG) and it stops its actors in order. The kernel's "parent" is
the thread that forked the supervisor, not the process: an engine started from
another thread would be stopped when that thread ends. So by default only
``start()`` on the main thread asks for it (the main thread lives as long as the
process); ``die_with_parent=True`` asks for it from any thread whose caller
knows the thread outlives the engine, ``False`` never.
"""

from __future__ import annotations

import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import zmq

from engine.client import StoreClient
from engine.config import StoreConfig

_PORTS_FROM = 20_000  # free_port picks below the system's ephemeral range (32768 and up on Linux)


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A port nothing listens on, below the system's ephemeral range: the ports the engine's
    writer and owners take for their direct answers (``engine/ipc/direct_replies.py``) and
    every outgoing connection come from that range, so a port picked here is not taken by
    them between the pick and the engine's bind."""
    rng = random.SystemRandom()
    top = max(_ephemeral_start(), _PORTS_FROM + 1_000)
    for _ in range(200):
        port = rng.randrange(_PORTS_FROM, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded host: any port the system gives
        s.bind(("127.0.0.1", 0))
        given: int = s.getsockname()[1]
        return given


def write_config(path: Path, config: StoreConfig) -> Path:
    """Write ``config`` as TOML (scalars, and lists of numbers)."""
    lines = []
    for name, value in config.to_toml_dict().items():
        if isinstance(value, bool):
            lines.append(f"{name} = {'true' if value else 'false'}")
        elif isinstance(value, int | float):
            lines.append(f"{name} = {value!r}")
        elif isinstance(value, tuple | list):
            lines.append(f"{name} = [{', '.join(repr(v) for v in value)}]")
        else:
            lines.append(f'{name} = "{value}"')
    path.write_text("\n".join(lines) + "\n")
    return path


class EngineFailed(RuntimeError):
    """The engine did not start or stop as expected; carries its output."""


class EngineProcess:
    def __init__(self, store_dir: Path, *, config: StoreConfig | None = None, port: int | None = None,
                 start_timeout_s: float = 60.0, die_with_parent: bool | None = None,
                 host: str = "127.0.0.1", wrapper: Sequence[str] = (),
                 context: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        """``host``: the address the client endpoint binds, IPv4 or IPv6 ("::1"). ``wrapper``: the
        words before the supervisor's command (``ip netns exec NS``: an engine on a test bed's host),
        ``context`` the ZeroMQ context ``client`` reaches it with (one whose connections leave from
        another host of the bed)."""
        self.store_dir = Path(store_dir).resolve()
        self.port = port or free_port()
        self.endpoint = f"tcp://[{host}]:{self.port}" if ":" in host else f"tcp://{host}:{self.port}"
        base = config or StoreConfig.test_min()
        self.config = base.replace(endpoint=self.endpoint, store_port=self.port)
        self.start_timeout_s = start_timeout_s
        self.die_with_parent = die_with_parent
        self.wrapper = list(wrapper)
        self.context = context
        self.process: subprocess.Popen[bytes] | None = None
        self.output = b""
        self.descendants: list[psutil.Process] = []

    def __enter__(self) -> EngineProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        config_path = write_config(self.store_dir.parent / f"{self.store_dir.name}.toml", self.config)
        command = [*self.wrapper, sys.executable, "-m", "supervisor", "start", "--store-dir", str(self.store_dir),
                   "--config", str(config_path)]
        die_with_parent = self.die_with_parent
        if die_with_parent is None:
            die_with_parent = threading.current_thread() is threading.main_thread()
        if die_with_parent:
            command += ["--die-with-parent", str(os.getpid())]
        self.output = b""
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        if not self._read_until(b"\nready ", self.start_timeout_s):  # the line, not the log's "engine ready on"
            self.kill()
            raise EngineFailed(f"engine did not become ready:\n{self.output.decode(errors='replace')}")
        self.descendants = psutil.Process(self.process.pid).children(recursive=True)

    def _read_until(self, marker: bytes | None, timeout_s: float) -> bool:
        """Read the supervisor's output until ``marker`` (None: until it closes); False on timeout or EOF.

        A marker that starts with a newline also matches at the start of the output.
        """
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while marker is None or marker not in b"\n" + self.output:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return False
                chunk = os.read(self.process.stdout.fileno(), 65536)
                if not chunk:
                    return False
                self.output += chunk
        return True

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def actor_pids(self) -> dict[str, int]:
        """Actor name -> pid, from the processes' command lines."""
        found = {}
        for child in psutil.Process(self.pid).children():
            try:
                cmd = child.cmdline()
            except psutil.Error:
                continue
            if "--name" in cmd:
                found[cmd[cmd.index("--name") + 1]] = child.pid
        return found

    def client(self, *, timeout_ms: int = 10_000) -> StoreClient:
        return StoreClient(self.endpoint, timeout_ms=timeout_ms, context=self.context)

    def stop(self, timeout_s: float = 60.0) -> int:
        """Ctrl-C the supervisor and wait for it and every actor to exit; returns its exit code."""
        if self.process is None:
            return 0
        tree = self._tree()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self._read_until(None, timeout_s)  # everything it prints, up to its exit
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise EngineFailed(f"engine did not stop:\n{self.output.decode(errors='replace')}") from None
        _gone, alive = psutil.wait_procs(tree, timeout=timeout_s)
        for proc in alive:
            proc.kill()
        self.process.stdout.close()  # type: ignore[union-attr]
        self.process = None
        if alive:
            raise EngineFailed(f"actors outlived the supervisor: {[p.pid for p in alive]}")
        return code

    def kill(self) -> None:
        """SIGKILL every actor, then the supervisor: all stop at once, as in a power cut.

        Actors go first: killed after the supervisor, they would get its death
        signal and stop cleanly, flushing what a power cut would not have. The
        supervisor is stopped (SIGSTOP) before its actors are listed: one it
        started after the list (restarting an actor) would outlive the kill.
        """
        if self.process is None:
            return
        supervisor = psutil.Process(self.process.pid)
        try:
            supervisor.suspend()
        except psutil.NoSuchProcess:
            pass
        tree = self._tree()
        for proc in [*tree, supervisor]:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(tree, timeout=30)
        self.process.wait(30)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def _tree(self) -> list[psutil.Process]:
        assert self.process is not None
        try:
            current = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            current = []
        known = {p.pid: p for p in [*self.descendants, *current]}
        return [p for p in known.values() if p.is_running()]
