"""etcd members on this machine, for ``cluster start`` and the tests: Debian's ``etcd-server``
(``apt-get install etcd-server``), one process per member, stopped by its pid.

A member listens for clients on ``client_port`` and for its peers on ``peer_port``, all on
loopback; ``--initial-cluster`` names every member, so three started together form one etcd
cluster of three (it answers while two of them run).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import psutil

ETCD = "etcd"
_READY_POLL_S = 0.05


class EtcdNotInstalled(RuntimeError):
    pass


class EtcdPortInUse(RuntimeError):
    pass


@dataclass
class EtcdMember:
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def command(self, initial_cluster: str, *, state: str) -> list[str]:
        return [ETCD, "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
                "--heartbeat-interval", "100", "--election-timeout", "1000"]


class EtcdCluster:
    """``ports``: one (client, peer) pair per member."""

    def __init__(self, root: Path, ports: list[tuple[int, int]]) -> None:
        if shutil.which(ETCD) is None:
            raise EtcdNotInstalled("etcd is not installed (Debian: apt-get install etcd-server)")
        self.root = root
        self.members = [EtcdMember(f"etcd-{k}", root / f"etcd-{k}", client, peer)
                        for k, (client, peer) in enumerate(ports)]
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> str:
        """The value of ``etcd_endpoints``."""
        return ",".join(member.client_url for member in self.members)

    def start(self, timeout_s: float = 20.0) -> None:
        for member in self.members:
            self.start_member(member)
        self.wait_ready(timeout_s)

    def start_member(self, member: EtcdMember) -> None:
        for port in (member.client_port, member.peer_port):  # else the health check could find another etcd
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as etcd binds: TIME_WAIT is no owner
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    raise EtcdPortInUse(f"port {port} is in use (another etcd?): etcd {member.name} not started") \
                        from None
        member.data_dir.parent.mkdir(parents=True, exist_ok=True)
        state = "existing" if member.data_dir.exists() else "new"
        log = open(self.root / f"{member.name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            member.process = subprocess.Popen(member.command(self.initial_cluster, state=state),
                                              stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              start_new_session=True)
        finally:
            log.close()

    def wait_ready(self, timeout_s: float) -> None:
        """Until a running member answers its health check (the cluster has a leader)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for member in self.members:
                if member.process is None or member.process.poll() is not None:
                    continue
                try:
                    with urlopen(member.client_url + "/health", timeout=0.5) as reply:
                        if b'"true"' in reply.read():
                            return
                except (URLError, OSError):
                    pass
            time.sleep(_READY_POLL_S)
        raise TimeoutError(f"etcd did not become healthy within {timeout_s} s (logs in {self.root})")

    def pids(self) -> list[int]:
        return [member.process.pid for member in self.members if member.process is not None]

    def kill_member(self, k: int) -> None:
        process = self.members[k].process
        if process is not None:
            process.send_signal(signal.SIGKILL)
            process.wait()
            self.members[k].process = None

    def stop(self) -> None:
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                member.process.terminate()
        for member in self.members:
            if member.process is not None:
                try:
                    member.process.wait(10)
                except subprocess.TimeoutExpired:
                    member.process.kill()
                    member.process.wait()
                member.process = None


def stop_pids(pids: list[int], timeout_s: float = 10.0) -> None:
    """Stop etcd members started by an earlier command (``cluster stop``): SIGTERM, then SIGKILL."""
    processes = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.name() == ETCD:
                process.terminate()
                processes.append(process)
        except psutil.Error:
            continue
    _gone, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in alive:
        process.kill()
